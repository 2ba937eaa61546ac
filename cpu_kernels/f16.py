"""float16 <-> float32 inside Numba kernels (numba cannot type float16 arrays on the CPU, so caches travel
as uint16 bits): LLVM half conversions where the CPU has F16C, exact integer bit routines elsewhere."""
from __future__ import annotations

import platform

import llvmlite.binding as llvm_binding
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from cpu_kernels.activations import bits_to_f32, f32_to_bits

_JIT = dict(cache=True, error_model="numpy")


# ---------------------------------------------------------------- float16 <-> float32
@intrinsic
def _f16_to_f32_hw(typingctx, bits):
    if not (isinstance(bits, types.Integer) and bits.bitwidth == 16):
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(bits), codegen


@intrinsic
def _f32_to_f16_hw(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(x), codegen


@njit(**_JIT)
def f16_to_f32_soft(h):
    """float16 bits (uint16) -> float32, integer operations only."""
    hi = np.int64(h)
    sign = (hi & 0x8000) << 16
    e = (hi >> 10) & 0x1F
    m = hi & 0x3FF
    if e == 0:  # zero or subnormal: m * 2^-24 is exact in float32
        f = np.float32(m) * np.float32(5.9604644775390625e-08)
        return -f if sign != 0 else f
    if e == 31:
        bits = sign | 0x7F800000 | (m << 13)
        if m != 0:
            bits |= 0x400000  # quiet NaN, as the hardware conversion gives
    else:
        bits = sign | ((e + 112) << 23) | (m << 13)
    return bits_to_f32(bits)


@njit(**_JIT)
def f32_to_f16_soft(x):
    """float32 -> float16 bits (uint16), round to nearest even, integer operations only."""
    u = np.int64(f32_to_bits(np.float32(x)))
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a >= 0x7F800000:  # inf, nan (quiet, top payload bits kept)
        r = 0x7C00 | ((0x200 | ((a >> 13) & 0x3FF)) if a > 0x7F800000 else 0)
    elif a >= 0x477FF000:  # >= 65520 rounds to inf
        r = 0x7C00
    elif a < 0x38800000:  # below 2^-14: adding 0.5 lines the float16 subnormal up with float32's
        f = bits_to_f32(a) + np.float32(0.5)  # last mantissa bits, rounded to nearest even by the FPU
        r = np.int64(f32_to_bits(f)) - 0x3F000000
    else:  # normal: rebias the exponent, round the 13 dropped bits to nearest even
        r = (a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13
    return np.uint16(r | sign)


def _hw_f16() -> bool:
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        return bool(llvm_binding.get_host_cpu_features().get("f16c", False))
    return True  # aarch64 and others convert half natively


if _hw_f16():
    f16_to_f32, f32_to_f16 = _f16_to_f32_hw, _f32_to_f16_hw
else:
    f16_to_f32, f32_to_f16 = f16_to_f32_soft, f32_to_f16_soft


def _load_f32(x):
    """Cache element -> float32 (uint16 elements are float16 bits)."""


@overload(_load_f32)
def _load_f32_impl(x):
    if isinstance(x, types.Integer):
        return lambda x: f16_to_f32(x)
    return lambda x: np.float32(x)


def _encode(x, cache):
    """float32 -> the element type of cache."""


@overload(_encode)
def _encode_impl(x, cache):
    if cache.dtype == types.uint16:
        return lambda x, cache: f32_to_f16(np.float32(x))
    return lambda x, cache: np.float32(x)


@njit(**_JIT)
def f16_bits_to_f32_array(h, out):
    """Test helper: out[i] = float(h[i]) with the conversion the kernels use."""
    for i in range(h.shape[0]):
        out[i] = _load_f32(h[i])


@njit(**_JIT)
def f32_to_f16_bits_array(x, out):
    """Test helper: out[i] = float16 bits of x[i] with the conversion the kernels use."""
    for i in range(x.shape[0]):
        out[i] = _encode(x[i], out)
