"""float16 <-> float32 inside Numba kernels (numba cannot type float16 arrays on the CPU, so caches travel
as uint16 bits): LLVM half conversions where the CPU has F16C, exact integer bit routines elsewhere. The fp8 KV
caches (kv_cache_dtype fp8_e4m3 / fp8_e5m2) travel as their bytes, e4m3fn in uint8 arrays and e5m2 in int8 arrays
(the two byte types tell the formats apart in the overloads below), encoded with round-to-nearest-even and
saturation at the largest finite value (vLLM's fp8 KV with unit scales) and decoded through float16 bits."""
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


# ---------------------------------------------------------------- fp8 (e4m3fn, e5m2) <-> float32
@njit(**_JIT)
def e4m3_to_f32(b):
    """An e4m3fn byte (uint8) -> float32: its sign, exponent and mantissa placed as float16 bits (exponent bias 15
    for 7, subnormals included) times 2^8. The byte read as int8 and shifted left by 7 puts the sign in bits 15 and
    14 and the rest in 13..7; clearing bit 14 leaves the float16 (one shift and one mask per lane). Exact; the NaN
    byte 0x7F (never written) reads as 480."""
    return f16_to_f32(np.uint16((np.int64(np.int8(b)) << 7) & 0xBF80)) * np.float32(256.0)


@njit(**_JIT)
def e5m2_to_f32(b):
    """An e5m2 byte (int8) -> float32: the top byte of a float16. Exact."""
    return f16_to_f32(np.uint16(np.uint16(np.uint8(b)) << np.uint16(8)))


@njit(**_JIT)
def _f32_to_fp8(x, top, min_normal, sub_at, sub_bits, rebias, drop, max_code):
    """float32 -> an fp8 byte (as int64), round to nearest even, saturating at max_code (the largest finite value;
    top: its float32 bits) with NaN kept NaN. Below min_normal (bits) the subnormal steps are rounded by the FPU at
    sub_at (a float whose ulp is one step; sub_bits its bits); normal values are rebiased and rounded over the
    `drop` dropped mantissa bits."""
    u = np.int64(f32_to_bits(np.float32(x)))
    sign = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        r = 0x7F
    elif a >= top:  # inf too
        r = max_code
    elif a < min_normal:
        r = np.int64(f32_to_bits(bits_to_f32(a) + np.float32(sub_at))) - sub_bits
    else:
        r = min((a - rebias + ((1 << (drop - 1)) - 1) + ((a >> drop) & 1)) >> drop, max_code)
    return r | sign


@njit(**_JIT)
def f32_to_e4m3(x):
    """float32 -> e4m3fn byte (uint8): saturating at +-448 (bits 0x43E00000), subnormals below 2^-6 in steps of
    2^-9 (the ulp of 2^14), exponent bias 127 -> 7, 20 mantissa bits dropped."""
    return np.uint8(_f32_to_fp8(x, 0x43E00000, 0x3C800000, 16384.0, 0x46800000, 0x3C000000, 20, 0x7E))


@njit(**_JIT)
def f32_to_e5m2(x):
    """float32 -> e5m2 byte (as int8): saturating at +-57344 (bits 0x47600000), subnormals below 2^-14 in steps of
    2^-16 (the ulp of 2^7), exponent bias 127 -> 15, 21 mantissa bits dropped."""
    v = _f32_to_fp8(x, 0x47600000, 0x38800000, 128.0, 0x43000000, 0x38000000, 21, 0x7B)
    return np.int8(v - 256 if v >= 128 else v)


def _load_f32(x):
    """Cache element -> float32 (uint16: float16 bits; uint8: e4m3fn; int8: e5m2)."""


@overload(_load_f32)
def _load_f32_impl(x):
    if x == types.uint8:
        return lambda x: e4m3_to_f32(x)
    if x == types.int8:
        return lambda x: e5m2_to_f32(x)
    if isinstance(x, types.Integer):
        return lambda x: f16_to_f32(x)
    return lambda x: np.float32(x)


def _encode(x, cache):
    """float32 -> the element type of cache."""


@overload(_encode)
def _encode_impl(x, cache):
    if cache.dtype == types.uint16:
        return lambda x, cache: f32_to_f16(np.float32(x))
    if cache.dtype == types.uint8:
        return lambda x, cache: f32_to_e4m3(x)
    if cache.dtype == types.int8:
        return lambda x, cache: f32_to_e5m2(x)
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
