"""FP8 weights as codes on AVX-512 VBMI + BF16 hosts (k_fp8.py): each e4m3 byte's bits reordered at load so that one
vpmultishiftqb and one AND make bfloat16 words of it, where a table lookup per byte half and an interleave did.

- A code is s e0 m2 m1 m0 e3 e2 e1 (bit 7 to 0) for the e4m3 byte s e3 e2 e1 e0 m2 m1 m0: an 8-bit window starting
  at a code's bit 0 holds the sign and the exponent's top bits where a bfloat16's high byte has them, one starting a
  bit lower holds e0 and the mantissa where its low byte has them. The word, masked to 0x87F0, is s | magnitude << 4:
  the bfloat16 of value * 2**-120 (exact), zero for zero.
- e4m3's subnormals become bfloat16 denormals, which vdpbf16ps reads as zero: the repack flags each row's 128-value
  blocks that hold one, and the kernel adds those values' products from a table of value * 2**-8 (normal numbers).
- Of 64 codes, vector A gets bytes 0-3 of each 8, vector B bytes 4-7 (CODE_ORDER: the activations' order).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .fp8_simd import HAS_BF16_VBMI, i16x32, widen_e4m3, _I8, _I32, _V32W, _V64B
from .qtypes import e4m3_to_f32
from .simd import CACHE, _ptr, _splat, f32x16

CODE_LAYOUT = HAS_BF16_VBMI
X_SCALE = np.float32(2.0 ** 64)  # activations times this: products of value * 2**-120 stay normal float32
D_SCALE = np.float32(2.0 ** 56)  # the scales times this: 2**-120 * 2**64 * 2**56 = 1
SUB_SCALE = np.float32(2.0 ** -112)  # the subnormal table's value * 2**-8 back to value * 2**-120
CODE_ORDER = np.array([8 * q + half + k for half in (0, 4) for q in range(8) for k in range(4)])


@njit(cache=CACHE, inline="always")
def code_of(b):
    """The code of an e4m3 byte (uint8)."""
    return np.uint8((b & 0x80) | ((b & 0x0F) << 3) | ((b >> 4) & 0x07))


@njit(cache=CACHE, inline="always")
def e4m3_of(c):
    """The e4m3 byte of a code (uint8)."""
    return np.uint8((c & 0x80) | ((c & 0x07) << 4) | ((c >> 3) & 0x0F))


@njit(cache=CACHE, inline="always")
def is_subnormal(b):
    """Whether an e4m3 byte is a subnormal (exponent 0, mantissa not)."""
    return (b & 0x78) == 0 and (b & 0x07) != 0


def _sub_tables() -> tuple[np.ndarray, np.ndarray]:
    """Per code magnitude (128): the bfloat16 bytes of a subnormal's value * 2**-8, zero for every other code."""
    mag = np.arange(128, dtype=np.uint8)
    raw = ((mag & 0x07) << 4) | ((mag >> 3) & 0x0F)
    vals = np.where(((raw & 0x78) == 0) & ((raw & 0x07) != 0), e4m3_to_f32(raw) / np.float32(256.0), 0)
    bits = (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    assert ((bits.astype(np.uint32) << 16).view(np.float32) == vals).all()
    return (bits & 0xFF).astype(np.uint8), (bits >> 8).astype(np.uint8)


_SUB_LO, _SUB_HI = _sub_tables()
_MSQ = [ir.Constant(_V64B, [(8 * (half + k // 2) - (k + 1) % 2) % 64 for _ in range(8) for k in range(8)])
        for half in (0, 4)]


def _u8_array(arr, idx):
    return isinstance(arr, types.Array) and arr.dtype == types.uint8 and isinstance(idx, types.Integer)


def _word_pair(make_halves, doc: str):
    """An intrinsic (uint8 array, idx) -> the two i16x32 vectors make_halves(builder, 64 loaded codes) builds."""
    def impl(typingctx, arr, idx):
        if not _u8_array(arr, idx):
            return None
        ret = types.UniTuple(i16x32, 2)

        def codegen(context, builder, sig, args):
            i = context.cast(builder, args[1], sig.args[1], types.intp)
            v = builder.load(_ptr(context, builder, sig.args[0], args[0], i, _V64B), align=1)
            return context.make_tuple(builder, ret, make_halves(builder, v))
        return ret(arr, idx), codegen
    impl.__doc__ = doc
    return intrinsic(impl)


def _code_words(builder, v):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V64B, [_V64B] * 2),
                                        "llvm.x86.avx512.pmultishift.qb.512")
    mask = ir.Constant(_V32W, [0x87F0] * 32)
    return [builder.and_(builder.bitcast(builder.call(fn, [ctrl, v]), _V32W), mask) for ctrl in _MSQ]


def _subnormal_words(builder, v):
    perm = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V64B, [_V64B] * 3),
                                          "llvm.x86.avx512.vpermi2var.qi.512")
    table = lambda t: ir.Constant(_V64B, [int(b) for b in t])  # noqa: E731
    lo = builder.call(perm, [table(_SUB_LO[:64]), v, table(_SUB_LO[64:])])
    hi = builder.call(perm, [table(_SUB_HI[:64]), v, table(_SUB_HI[64:])])
    hi = builder.or_(hi, builder.and_(v, _splat(builder, ir.Constant(_I8, 0x80), 64)))
    halves = []
    for half in (0, 4):
        order = [k for q in range(8) for j in range(half, half + 4) for k in (8 * q + j, 64 + 8 * q + j)]
        w = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 64), order))
        halves.append(builder.bitcast(w, _V32W))
    return halves


code_bf16x64 = _word_pair(_code_words, "64 codes of a uint8 array from element idx -> (A, B): i16x32 of bfloat16 "
                                       "bits of value * 2**-120.")
code_subnormal_bf16x64 = _word_pair(_subnormal_words, "64 codes -> (A, B) as code_bf16x64's, of the subnormals' "
                                                      "value * 2**-8 and zero for every other code.")


@intrinsic
def load_code_x16(typingctx, arr, idx):
    """16 codes of a uint8 array from element idx -> f32x16 of their values / 256 (as fp8_simd.load_e4m3x16)."""
    if not _u8_array(arr, idx):
        return None

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        c = builder.load(_ptr(context, builder, sig.args[0], args[0], i, ir.VectorType(_I8, 16)), align=1)
        k = lambda n: _splat(builder, ir.Constant(_I8, n), 16)  # noqa: E731
        b = builder.or_(builder.or_(builder.and_(c, k(0x80)), builder.shl(builder.and_(c, k(0x07)), k(4))),
                        builder.and_(builder.lshr(c, k(3)), k(0x0F)))
        return widen_e4m3(builder, b)
    return f32x16(arr, idx), codegen
