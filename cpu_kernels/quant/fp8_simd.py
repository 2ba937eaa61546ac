"""The vector steps of the FP8_E4M3 kernels (k_fp8.py) shared by both hosts' paths.

- load_e4m3x16 (any x86-64 with F16C): 16 bytes sign-extended to 16 bits and shifted left by 7 put a byte's sign in
  bit 15 (a copy in bit 14 is masked off) and its exponent and mantissa in float16's fields; float16's exponent bias
  is 15 where e4m3's is 7, so the lanes hold value / 256 (subnormals included), widened by vcvtph2ps.
- dpbf16 (AVX-512 BF16 hosts): vdpbf16ps over i16x32 vectors of bfloat16 bits (the words fp8_codes.py makes).
"""
from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .simd import FORCE_PORTABLE, HOST_FEATURES, SIMD_LEVEL, Vec, _ptr, _splat, f32x16

# vdpbf16ps has no LLVM type llvmlite can spell (bfloat), so it is inline assembly, which needs the asm parser.
HAS_BF16_VBMI = (not FORCE_PORTABLE and SIMD_LEVEL == "auto"
                 and {"avx512bf16", "avx512vbmi", "avx512bw", "avx512f"} <= HOST_FEATURES)
if HAS_BF16_VBMI:
    llvm.initialize_native_asmparser()

i16x32 = Vec("i16", 32)
_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V64B, _V32W, _F16 = ir.VectorType(_I8, 64), ir.VectorType(_I16, 32), ir.VectorType(ir.FloatType(), 16)


@intrinsic
def load_e4m3x16(typingctx, arr, idx):
    """16 e4m3 bytes of a uint8 array from element idx -> f32x16 of their values / 256."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint8 and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        p = _ptr(context, builder, sig.args[0], args[0], i, ir.VectorType(_I8, 16))
        return widen_e4m3(builder, builder.load(p, align=1))
    return f32x16(arr, idx), codegen


def widen_e4m3(builder, b):
    """<16 x i8> e4m3 bytes -> <16 x float> of their values / 256 (the module's first recipe)."""
    w = builder.sext(b, ir.VectorType(_I16, 16))
    h = builder.and_(builder.shl(w, _splat(builder, ir.Constant(_I16, 7), 16)),
                     _splat(builder, ir.Constant(_I16, 0xBFFF), 16))
    return builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), 16)), _F16)


@intrinsic
def fma(typingctx, acc, a, b):
    """a * b + acc rounded once (vfmadd; f32 vectors of one type): every caller gets the same bits."""
    if not (isinstance(acc, Vec) and acc.kind == "f32" and a == acc and b == acc):
        return None

    def codegen(context, builder, sig, args):
        vt = context.get_value_type(sig.args[0])
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fma.v{acc.n}f32")
        return builder.call(fn, [args[1], args[2], args[0]])
    return acc(acc, a, b), codegen


@intrinsic
def load_i16x32(typingctx, arr, idx):
    """32 uint16 values (bfloat16 bits) from element idx."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint16 and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        return builder.load(_ptr(context, builder, sig.args[0], args[0], i, _V32W), align=1)
    return i16x32(arr, idx), codegen


@intrinsic
def dpbf16(typingctx, acc, a, b):
    """acc + a . b per pair of bfloat16 lanes (vdpbf16ps: products exact, float32 accumulation)."""
    if not (isinstance(acc, Vec) and acc.kind == "f32" and acc.n == 16 and a == i16x32 and b == i16x32):
        return None

    def codegen(context, builder, sig, args):
        ft = ir.FunctionType(_F16, [_V32W, _V32W, _F16])
        return builder.asm(ft, "vdpbf16ps $2, $1, $0", "=v,v,v,0", [args[1], args[2], args[0]], side_effect=False)
    return acc(acc, a, b), codegen
