"""The GEMV of the IQ2 and IQ3 grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): two 32-value blocks a vector.

Per pair of blocks: their 64 lattice magnitudes from table words (8 or 16 words inserted into one vector), their 64
signs as one 64-bit mask that negates the activations (a masked subtract), one 512-bit vpdpbusd, and the pair's 16
lane factors (each 16 values' scale times its activation block's scale) taken from one vector of the super-block's
factors, computed once per super-block in registers. The 7-bit sign fields of IQ2_XXS, IQ2_XS and IQ3_XXS (the
eighth sign is their parity) become the mask in vector registers on hosts with AVX-512 VBMI and BITALG
(vpmultishiftqb picks each sign's bit, vpopcntb the parity); elsewhere the same mask is built with scalar
operations. Every row's sums are one chain in a fixed order, so any number of activation rows gives each row the
bits of a single-row call. The registry uses these kernels on AVX-512 VNNI hosts (wide.PAIR), k_grid's elsewhere.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .dot import _x86
from .grids import GRID_IQ2S, GRID_IQ3S, GRID_IQ3XXS
from .k_grid import IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, TYPE_SIZE, half, signed_block
from .q8act import quantize_act
from .simd import (_I32, CACHE, HAS_VNNI, HOST_FEATURES, Vec, _make_load, _make_zero, _ptr, concat, f32x16, hsum,
                   load_f32x16, load_f32x8, muladd, store, to_f32, vmul, zero_f32x16)
from .wide import dpbusd16, i32x16, load_u8x64, u8x64

# Sign fields expanded by vpmultishiftqb / vpopcntb (Ice Lake, Zen 4 and later).
VECTOR_SIGNS = HAS_VNNI and {"avx512vbmi", "avx512bitalg"} <= HOST_FEATURES
_I8, _I64, _F32 = ir.IntType(8), ir.IntType(64), ir.FloatType()
ld64 = _make_load(types.uint64, (types.uint8,))


def _sign_bit_offsets(base: int, stride: int) -> list[int]:
    """Per value of a 32-block with four 7-bit sign fields at base + stride * f: the bit holding its sign (for the
    eighth value of each field: the field's first bit, whose field the parity is taken over)."""
    return [base + stride * (k >> 3) + (k & 7 if k & 7 < 7 else 0) for k in range(32)]


def _make_ksign_mask(base0: int, base1: int, stride: int, vector: bool = VECTOR_SIGNS):
    """An intrinsic (w0, w1) -> uint64: the signs of a pair of 32-blocks whose four 7-bit sign fields lie at
    base + stride * f of w0 (first block) and w1 (second), each field's parity its eighth sign (ksigns_iq2xs).
    vector: the VBMI/BITALG lowering (else scalar operations; tests build both)."""
    offs = _sign_bit_offsets(base0, stride) + _sign_bit_offsets(base1, stride)

    @intrinsic
    def ksign_mask(typingctx, w0, w1):
        if not (w0 == types.uint64 and w1 == types.uint64):
            return None

        def codegen(context, builder, sig, args):
            if vector:  # each byte of word w gets the 8 bits from its sign's offset; keep 1 bit or the field
                V = ir.VectorType(_I8, 64)
                v = ir.Constant(ir.VectorType(_I64, 8), ir.Undefined)
                v = builder.insert_element(v, args[0], ir.Constant(_I32, 0))
                v = builder.insert_element(v, args[1], ir.Constant(_I32, 4))
                v = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 8), [0, 0, 0, 0, 4, 4, 4, 4]))
                bits = _x86(builder, "llvm.x86.avx512.pmultishift.qb.512", V,
                             [ir.Constant(V, [o & 63 for o in offs]), builder.bitcast(v, V)])
                keep = ir.Constant(V, [0x7F if k & 7 == 7 else 1 for k in range(64)])
                ones = _x86(builder, "llvm.ctpop.v64i8", V, [builder.and_(bits, keep)])
                odd = builder.icmp_unsigned("!=", builder.and_(ones, ir.Constant(V, [1] * 64)), ir.Constant(V, None))
                return builder.bitcast(odd, _I64)
            mask = ir.Constant(_I64, 0)
            for h, (w, base) in enumerate(((args[0], base0), (args[1], base1))):
                for f in range(4):
                    field = builder.and_(builder.lshr(w, ir.Constant(_I64, base + stride * f)), ir.Constant(_I64, 127))
                    par = builder.and_(_x86(builder, "llvm.ctpop.i64", _I64, [field]), ir.Constant(_I64, 1))
                    byte = builder.or_(field, builder.shl(par, ir.Constant(_I64, 7)))
                    mask = builder.or_(mask, builder.shl(byte, ir.Constant(_I64, 32 * h + 8 * f)))
            return mask
        return types.uint64(w0, w1), codegen
    return ksign_mask


ksigns_iq2_xxs = _make_ksign_mask(32, 32, 7)  # the 8-byte block words: 4 grid bytes, then 4 fields and the scale
ksigns_iq2_xs = _make_ksign_mask(9, 9, 16)  # four 16-bit words per block: a 9-bit grid index, then 7 sign bits
ksigns_iq3_xxs = _make_ksign_mask(0, 32, 7)  # one 32-bit word per block: 4 fields and the scale


@intrinsic
def negate_where(typingctx, x, mask):
    """x's bytes negated where mask's bits are set (bit i for byte i)."""
    if not (x == u8x64 and mask == types.uint64):
        return None

    def codegen(context, builder, sig, args):
        vx, m = args
        return builder.select(builder.bitcast(m, ir.VectorType(ir.IntType(1), 64)),
                              builder.sub(ir.Constant(vx.type, None), vx), vx)
    return u8x64(x, mask), codegen


zero_i32x16 = _make_zero(i32x16)


def _load_vec(builder, context, arrty, arr, off, vt):
    """The vt vector at byte off (int64) of a uint8 array, unaligned."""
    return builder.load(_ptr(context, builder, arrty, arr, context.cast(builder, off, types.int64, types.intp), vt),
                        align=1)


@intrinsic
def super_scales16(typingctx, raw, o, fmt, d):
    """f32x16: the scale of each 16 values of the super-block at raw[o:] (fmt a literal in FORMATS), d its fp16
    scale as float32: gguf's order of operations (IQ2: d * (0.5 + s) * 0.25, IQ3_XXS: * 0.5, IQ3_S: d * (1 + 2 s))."""
    if not isinstance(fmt, types.IntegerLiteral) or fmt.literal_value not in FORMATS:
        return None
    f = fmt.literal_value

    def codegen(context, builder, sig, args):
        row, off, _, dv = args
        off = context.cast(builder, off, sig.args[1], types.int64)

        def at(k):
            return builder.add(off, ir.Constant(_I64, k))

        def shuf(v, idx):
            return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 16), idx))
        V16 = ir.VectorType(_I32, 16)
        if f == IQ2_XXS:  # each block's 4-bit scale tops its 8-byte word
            w = _load_vec(builder, context, sig.args[0], row, at(2), ir.VectorType(_I64, 8))
            n = shuf(builder.trunc(builder.lshr(w, ir.Constant(w.type, [60] * 8)), ir.VectorType(_I32, 8)),
                     [k >> 1 for k in range(16)])
        elif f == IQ3_XXS:  # ... or its 32-bit scale-and-signs word
            w = _load_vec(builder, context, sig.args[0], row, at(66), ir.VectorType(_I32, 8))
            n = shuf(builder.lshr(w, ir.Constant(w.type, [28] * 8)), [k >> 1 for k in range(16)])
        elif f in (IQ2_XS, IQ2_S):  # a nibble per 16 values, low nibble first
            b = _load_vec(builder, context, sig.args[0], row, at(66 if f == IQ2_XS else 74), ir.VectorType(_I8, 8))
            n = shuf(builder.zext(b, ir.VectorType(_I32, 8)), [k >> 1 for k in range(16)])
            n = builder.and_(builder.lshr(n, ir.Constant(V16, [4 * (k & 1) for k in range(16)])),
                             ir.Constant(V16, [15] * 16))
        else:  # IQ3_S: a nibble per 32 values
            b = _load_vec(builder, context, sig.args[0], row, at(106), ir.VectorType(_I8, 4))
            n = shuf(builder.zext(b, ir.VectorType(_I32, 4)), [k >> 2 for k in range(16)])
            n = builder.and_(builder.lshr(n, ir.Constant(V16, [4 * ((k >> 1) & 1) for k in range(16)])),
                             ir.Constant(V16, [15] * 16))
        F16 = ir.VectorType(_F32, 16)
        dd = builder.shuffle_vector(builder.insert_element(ir.Constant(F16, ir.Undefined), dv, ir.Constant(_I32, 0)),
                                    ir.Constant(F16, ir.Undefined), ir.Constant(V16, [0] * 16))
        if f == IQ3_S:
            one_2s = builder.add(builder.shl(n, ir.Constant(V16, [1] * 16)), ir.Constant(V16, [1] * 16))
            return builder.fmul(dd, builder.sitofp(one_2s, F16))
        s = builder.fmul(dd, builder.fadd(ir.Constant(F16, [0.5] * 16), builder.sitofp(n, F16)))
        return builder.fmul(s, ir.Constant(F16, [0.5 if f == IQ3_XXS else 0.25] * 16))
    return f32x16(raw, o, fmt, d), codegen


@intrinsic
def pair_blocks16(typingctx, v):
    """f32x16 whose lane k is v's lane k >> 1: a super-block's 8 per-block values over its 16 runs of 16 values."""
    if not (isinstance(v, Vec) and v.kind == "f32" and v.n == 8):
        return None

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[0], ir.Constant(ir.VectorType(_I32, 16),
                                                                     [k >> 1 for k in range(16)]))
    return f32x16(v), codegen


@intrinsic
def quads(typingctx, v, p):
    """f32x16 whose lanes 4 i..4 i + 3 are all v's lane 4 p + i: block pair p's factors (a 512-bit dot's lanes
    0-3 are the first 16 values, 4-7 the next, 8-15 the second block's)."""
    if not (v == f32x16 and isinstance(p, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        vv, pp = args
        base = builder.mul(context.cast(builder, pp, sig.args[1], types.int32), ir.Constant(_I32, 4))
        V16 = ir.VectorType(_I32, 16)
        idx = builder.add(builder.shuffle_vector(builder.insert_element(ir.Constant(V16, ir.Undefined), base,
                                                                        ir.Constant(_I32, 0)),
                                                 ir.Constant(V16, ir.Undefined), ir.Constant(V16, [0] * 16)),
                          ir.Constant(V16, [k >> 2 for k in range(16)]))
        if HAS_VNNI:  # one vpermps
            return _x86(builder, "llvm.x86.avx512.permvar.sf.512", vv.type, [vv, idx])
        out = ir.Constant(vv.type, ir.Undefined)
        for k in range(16):
            out = builder.insert_element(out, builder.extract_element(vv, builder.extract_element(
                idx, ir.Constant(_I32, k))), ir.Constant(_I32, k))
        return out
    return f32x16(v, p), codegen


@intrinsic
def grid_words(typingctx, grid, raw, o, j, fmt):
    """u8x64: the table words of 32-blocks j and j + 1 of the super-block at raw[o:] (fmt IQ2_S, IQ3_XXS or IQ3_S,
    a literal): each point's index read from its bytes in memory (not cut out of loaded words: fewer operations for
    these layouts) and its word inserted into the vector."""
    if not (isinstance(fmt, types.IntegerLiteral) and fmt.literal_value in (IQ2_S, IQ3_XXS, IQ3_S)):
        return None
    f = fmt.literal_value

    def codegen(context, builder, sig, args):
        g, row, off, jj = args[:4]
        data = context.make_array(sig.args[0])(context, builder, g).data
        rd = context.make_array(sig.args[1])(context, builder, row).data
        off = context.cast(builder, off, sig.args[2], types.int64)
        jv = context.cast(builder, jj, sig.args[3], types.int64)

        def u8(at):
            return builder.zext(builder.load(builder.gep(rd, [at])), _I64)

        def c(v):
            return ir.Constant(_I64, v)

        def at(base_k, mult, k):  # o + base_k + mult * j + k
            return builder.add(builder.add(off, builder.mul(jv, c(mult))), c(base_k + k))
        n = 16 if f in (IQ3_XXS, IQ3_S) else 8  # IQ3: 4 values a point
        words = ir.Constant(ir.VectorType(ir.IntType(32 if n == 16 else 64), n), ir.Undefined)
        for k in range(n):
            if f == IQ2_S:  # two high bits per index in qh byte j (or j + 1)
                h = builder.and_(builder.lshr(u8(at(66, 1, k >> 2)), c(2 * (k & 3))), c(3))
                i = builder.or_(u8(at(2, 4, k)), builder.shl(h, c(8)))
            elif f == IQ3_XXS:
                i = u8(at(2, 8, k))
            else:  # IQ3_S: one high bit per index
                h = builder.and_(builder.lshr(u8(at(66, 1, k >> 3)), c(k & 7)), c(1))
                i = builder.or_(u8(at(2, 8, k)), builder.shl(h, c(8)))
            words = builder.insert_element(words, builder.load(builder.gep(data, [i])), ir.Constant(_I32, k))
        return builder.bitcast(words, ir.VectorType(_I8, 64))
    return u8x64(grid, raw, o, j, fmt), codegen


FORMATS = (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S)


@njit(cache=CACHE, inline="always")
def pair_mags(row, o, fmt, j):
    """u8x64: the lattice magnitudes of 32-blocks j and j + 1 of the super-block at row[o:]."""
    if fmt == IQ2_S:
        return grid_words(GRID_IQ2S, row, o, j, fmt)
    if fmt == IQ3_XXS:
        return grid_words(GRID_IQ3XXS, row, o, j, fmt)
    if fmt == IQ3_S:
        return grid_words(GRID_IQ3S, row, o, j, fmt)
    # IQ2_XXS, IQ2_XS: indices cut from the two 8-byte block words already loaded cost less than reading them again
    return concat(signed_block(row, o, fmt, j)[0], signed_block(row, o, fmt, j + 1)[0])


@njit(cache=CACHE, inline="always")
def pair_signs(row, o, fmt, j):
    """uint64: the signs of 32-blocks j and j + 1 (bit i set: value i is negative)."""
    if fmt == IQ2_XXS:
        return ksigns_iq2_xxs(ld64(row, o + 2 + 8 * j), ld64(row, o + 10 + 8 * j))
    if fmt == IQ2_XS:
        return ksigns_iq2_xs(ld64(row, o + 2 + 8 * j), ld64(row, o + 10 + 8 * j))
    if fmt == IQ3_XXS:
        w = ld64(row, o + 66 + 4 * j)
        return ksigns_iq3_xxs(w, w)
    return ld64(row, o + (34 if fmt == IQ2_S else 74) + 4 * j)  # IQ2_S, IQ3_S: a sign bit per value


@njit(cache=CACHE, inline="always")
def super_factors(row, o, fmt, xd, m, s):
    """f32x16: the 16 lane-group factors of super-block s for activation row m (scale of 16 values x xd)."""
    return vmul(super_scales16(row, o, fmt, half(row, o)), pair_blocks16(load_f32x8(xd, m * xd.shape[1] + 8 * s)))


def _make_gemv(fmt: int):
    ts = TYPE_SIZE[fmt]

    @njit(parallel=True, cache=CACHE)
    def gemv(w, x, out):
        """out (M, N) = x (M, K) @ W^T, Q8 activations; one 8-row group per work unit."""
        xq, xd, _, _, _ = quantize_act(x)
        M, K = x.shape
        N = out.shape[1]
        ns = K // 256
        for g in prange(w.shape[0]):
            row = w[g]
            if M == 1:  # decode: no scratch (three allocations per group cost it 7-10 %)
                for r in range(min(8, N - 8 * g)):
                    acc = zero_f32x16()
                    for s in range(ns):
                        o = (r * ns + s) * ts
                        fac = super_factors(row, o, fmt, xd, 0, s)
                        for p in range(4):
                            xs = negate_where(load_u8x64(xq, 256 * s + 64 * p), pair_signs(row, o, fmt, 2 * p))
                            iv = dpbusd16(zero_i32x16(), pair_mags(row, o, fmt, 2 * p), xs)
                            acc = muladd(acc, to_f32(iv), quads(fac, p))
                    out[0, 8 * g + r] = hsum(acc)
                continue
            accs, vb, masks = np.empty(16 * M, np.float32), np.empty(256, np.uint8), np.empty(4, np.uint64)
            for r in range(min(8, N - 8 * g)):
                accs[:] = 0
                for s in range(ns):  # the super-block's vectors once, then every activation row
                    o = (r * ns + s) * ts
                    for p in range(4):
                        store(vb, 64 * p, pair_mags(row, o, fmt, 2 * p))
                        masks[p] = pair_signs(row, o, fmt, 2 * p)
                    for m in range(M):
                        fac = super_factors(row, o, fmt, xd, m, s)
                        acc = load_f32x16(accs, 16 * m)
                        for p in range(4):
                            xs = negate_where(load_u8x64(xq, m * K + 256 * s + 64 * p), masks[p])
                            iv = dpbusd16(zero_i32x16(), load_u8x64(vb, 64 * p), xs)
                            acc = muladd(acc, to_f32(iv), quads(fac, p))
                        store(accs, 16 * m, acc)
                for m in range(M):
                    out[m, 8 * g + r] = hsum(load_f32x16(accs, 16 * m))
    return gemv


gemv_iq2_xxs, gemv_iq2_xs, gemv_iq2_s, gemv_iq3_xxs, gemv_iq3_s = (_make_gemv(f) for f in FORMATS)






