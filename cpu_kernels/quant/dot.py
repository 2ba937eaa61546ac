"""The int8 dot products of the GEMV kernels, one lowering per instruction set, all giving the same integers.

`dpbusd` calls the AVX-512 VNNI instruction when the host has it (simd.HAS_VNNI), on AVX2 hosts vpmaddwd pairs
(or, for `dpbusd7`'s weights below 128, vpmaddubsw + vpmaddwd, llama.cpp's way), and otherwise emits the same
arithmetic as generic IR, which LLVM lowers on any CPU. `dpbusd_q8` is Q8_0's signed variant and the short
accumulators (`zero_acc`, `dpbusd_acc`, `acc_i32`) sum runs of small-weight dots in 16 bits on AVX2.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils
from numba.extending import intrinsic

from .simd import _I32, HAS_AVX2, HAS_VNNI, i16x16, i32x8, u8x32


def _dpbusd_generic(builder, acc, a, b, n):
    """acc + sum over groups of 4 of zext(a) * sext(b): exactly what vpdpbusd computes."""
    vt = ir.VectorType(_I32, 4 * n)
    prod = builder.mul(builder.zext(a, vt), builder.sext(b, vt))
    for j in range(4):
        acc = builder.add(acc, builder.shuffle_vector(
            prod, prod, ir.Constant(ir.VectorType(_I32, n), list(range(j, 4 * n, 4)))))
    return acc


def _x86(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


_V8, _V16W = ir.VectorType(_I32, 8), ir.VectorType(ir.IntType(16), 16)


def _dpbusd_avx2(builder, acc, a, b):
    """Exact vpdpbusd for any bytes on AVX2: both halves widened to 16 bits, vpmaddwd, then adjacent pairs added."""
    halves = []
    for lo in (0, 16):
        idx = ir.Constant(ir.VectorType(_I32, 16), list(range(lo, lo + 16)))
        wa = builder.zext(builder.shuffle_vector(a, a, idx), _V16W)
        wb = builder.sext(builder.shuffle_vector(b, b, idx), _V16W)
        halves.append(_x86(builder, "llvm.x86.avx2.pmadd.wd", _V8, [wa, wb]))
    even = builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 8), list(range(0, 16, 2))))
    odd = builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 8), list(range(1, 16, 2))))
    return builder.add(acc, builder.add(even, odd))


def _dpbusd_avx2_small(builder, acc, a, b):
    """vpdpbusd when every byte of a is below 128 on AVX2: vpmaddubsw's 16-bit pair sums then cannot saturate
    (2 * 127 * 128 < 32768), and vpmaddwd by ones adds the pairs into the dword lanes."""
    pairs = _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16W, [a, b])
    return builder.add(acc, _x86(builder, "llvm.x86.avx2.pmadd.wd", _V8, [pairs, ir.Constant(_V16W, [1] * 16)]))


def _vpdpbusd(builder, acc, a, b):
    return _x86(builder, "llvm.x86.avx512.vpdpbusd.256", _V8, [acc, builder.bitcast(a, _V8), builder.bitcast(b, _V8)])


def _dot(avx2_lowering, doc: str):
    """An i32x8 dot intrinsic: vpdpbusd with VNNI, avx2_lowering on AVX2, generic IR elsewhere."""
    @intrinsic
    def dot(typingctx, acc, a, b):
        if not (acc == i32x8 and a == u8x32 and b == u8x32):
            return None

        def codegen(context, builder, sig, args):
            if HAS_VNNI:
                return _vpdpbusd(builder, *args)
            if HAS_AVX2:
                return avx2_lowering(builder, *args)
            return _dpbusd_generic(builder, *args, 8)
        return i32x8(acc, a, b), codegen
    dot.__doc__ = doc
    return dot


dpbusd = _dot(_dpbusd_avx2, "i32x8 acc + dot products of 4-byte groups: unsigned bytes a x signed bytes b "
                            "(u8x32 each).")
dpbusd7 = _dot(_dpbusd_avx2_small, "dpbusd for weights below 128 in every byte of a (4-, 5- and 6-bit quants): on AVX2 "
                                   "two instructions, not five.")


# Short accumulators: on AVX2 a run of dots of small weights sums vpmaddubsw's 16-bit pairs with vpaddw and widens
# once at the end (one vpmaddwd per run instead of one per dot); elsewhere they are the usual int32 lanes. A run
# must stay below 32768 per 16-bit lane: 2 * w_max * 128 * dots, i.e. at most 8 dots of 4-bit or 4 of 5-bit weights.
ACC_TYPE = i16x16 if HAS_AVX2 else i32x8


@intrinsic
def zero_acc(typingctx):
    """A zero short accumulator (ACC_TYPE)."""
    def codegen(context, builder, sig, args):
        return ir.Constant(context.get_value_type(sig.return_type), None)
    return ACC_TYPE(), codegen


@intrinsic
def dpbusd_acc(typingctx, acc, a, b):
    """dpbusd7 into a short accumulator (see ACC_TYPE for how many dots a run may hold)."""
    if not (acc == ACC_TYPE and a == u8x32 and b == u8x32):
        return None

    def codegen(context, builder, sig, args):
        vacc, va, vb = args
        if HAS_AVX2:
            return builder.add(vacc, _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16W, [va, vb]))
        if HAS_VNNI:
            return _vpdpbusd(builder, vacc, va, vb)
        return _dpbusd_generic(builder, vacc, va, vb, 8)
    return ACC_TYPE(acc, a, b), codegen


@intrinsic
def acc_i32(typingctx, acc):
    """A short accumulator's i32x8 dot sums (AVX2: vpmaddwd by ones adds the 16-bit pairs)."""
    if acc != ACC_TYPE:
        return None

    def codegen(context, builder, sig, args):
        if HAS_AVX2:
            return _x86(builder, "llvm.x86.avx2.pmadd.wd", _V8, [args[0], ir.Constant(_V16W, [1] * 16)])
        return args[0]
    return i32x8(acc), codegen


# Q8_0's weights are stored as value + 128 (unsigned, for vpdpbusd), and its kernels start each block's sum at
# -Q8_OFFSET times the activations' sum; on AVX2 dpbusd_q8 takes the 128 back off itself, so the offset is 0.
Q8_OFFSET = 0 if HAS_AVX2 else 128


def _dpbusd_avx2_q8(builder, acc, a, b):
    """acc + quad sums of (a - 128) x b on AVX2, for b above -128: |a - 128| x (b signed by a - 128) through
    vpmaddubsw (pairs at most 2 * 128 * 127, no saturation), then vpmaddwd by ones."""
    v = builder.xor(a, ir.Constant(a.type, [0x80] * 32))
    neg = builder.icmp_signed("<", v, ir.Constant(a.type, [0] * 32))
    mag = builder.select(neg, builder.neg(v), v)
    signed_b = _x86(builder, "llvm.x86.avx2.psign.b", a.type, [b, v])
    pairs = _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16W, [mag, signed_b])
    return builder.add(acc, _x86(builder, "llvm.x86.avx2.pmadd.wd", _V8, [pairs, ir.Constant(_V16W, [1] * 16)]))


dpbusd_q8 = _dot(_dpbusd_avx2_q8, "Q8_0's dot: acc + quad sums of (a - 128 + Q8_OFFSET) x b for stored weights a "
                                  "(value + 128) and int8 activations b in -127..127: plain dpbusd where Q8_OFFSET "
                                  "is 128, the signed dot on AVX2.")
