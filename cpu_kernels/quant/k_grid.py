"""Kernels for llama.cpp's grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), ternary
formats (TQ1_0, TQ2_0) and NVFP4: 1.56-4.5 bits a weight, 256-value super-blocks (NVFP4: 64 values, four
unsigned-e4m3 scales).

The weights stay as the file has them (repack.grid_rows only groups rows 8 by 8 and pads N). A GEMV reads each
row's super-blocks once and dots them with every activation row, an exact integer dot per 4 values times the scale
of their 16 values. The IQ1/IQ2/IQ3 types (SIGNED) build each 32-block's lattice magnitudes and +-1 signs as two
vectors in registers (four table words each) and multiply the magnitudes by the activations with the signs applied
(llama.cpp's way: vpdpbusd on unsigned magnitudes); TQ1_0, TQ2_0 and NVFP4 unpack a super-block into signed bytes +
128 (one small unpacker per format, also what dequantizing reads) for Q8_0's dot (dot.dpbusd_q8). On AVX-512 VNNI
hosts the IQ2/IQ3 types' GEMV is k_grid_pairs.py's (two blocks a 512-bit vector); the dequantizers stay here.

Scales per 16 values cover every format: IQ2_XS, IQ2_S, IQ1_M, NVFP4 have them; the others repeat their per-32 or
per-256 scale. IQ1's values g + delta (delta = +-1/8) are held as 8 g +- 1 with the scale divided by 8 (exact).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .dot import Q8_OFFSET, dpbusd, dpbusd_q8
from .grids import (GRID_IQ1_NEG_MAG, GRID_IQ1_NEG_SGN, GRID_IQ1_POS_MAG, GRID_IQ1_POS_SGN, GRID_IQ2S, GRID_IQ2XS,
                    GRID_IQ2XXS, GRID_IQ3S, GRID_IQ3XXS, KSIGN_PM, SIGN_PM)
from .q8act import quantize_act
from .simd import (CACHE, _make_load, f16_to_f32, hsum, i8_to_f32, load_f32x8, load_i32x8, load_u8x8, load_u8x32,
                   muladd, store, to_f32, u8x32, vmul, vshl, vsub, zero_f32x8, zero_i32x8)
from .simd_lanes import lanes2, pair16

IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, NVFP4 = range(10)
TYPE_SIZE = (66, 74, 82, 98, 110, 50, 56, 54, 66, 36)  # bytes per super-block, in the order above
SUPER = (256, 256, 256, 256, 256, 256, 256, 256, 256, 64)  # values per super-block
NVFP4_KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int32)  # e2m1, doubled


@intrinsic
def words_u8x32(typingctx, a, b, c, d):
    """u8x32 of four 64-bit words (a's bytes first), built in registers."""
    if not all(t == types.uint64 for t in (a, b, c, d)):
        return None

    def codegen(context, builder, sig, args):
        v = ir.Constant(ir.VectorType(ir.IntType(64), 4), ir.Undefined)
        for i, w in enumerate(args):
            v = builder.insert_element(v, w, ir.Constant(ir.IntType(32), i))
        return builder.bitcast(v, ir.VectorType(ir.IntType(8), 32))
    return u8x32(a, b, c, d), codegen


# ldN(raw, o): the little-endian uint at byte o of a uint8 array, unaligned, with no index checks.
ld8, ld16, ld32 = (_make_load(t, (types.uint8,)) for t in (types.uint8, types.uint16, types.uint32))


@intrinsic
def sign_bytes(typingctx, x, s):
    """x's int8 bytes negated where s's bytes are negative (vpsignb for signs of +-1)."""
    if not (x == u8x32 and s == u8x32):
        return None

    def codegen(context, builder, sig, args):
        vx, vs = args
        zero = ir.Constant(vx.type, None)
        return builder.select(builder.icmp_signed("<", vs, zero), builder.sub(zero, vx), vx)
    return u8x32(x, s), codegen


@njit(cache=CACHE)
def half(raw, o):
    return f16_to_f32(ld16(raw, o))


@njit(cache=CACHE)
def pair3(grid, i0, i1):
    """Two IQ3 points (4 magnitudes each) as one 8-byte word."""
    return np.uint64(grid[i0]) | (np.uint64(grid[i1]) << np.uint64(32))


@njit(cache=CACHE)
def nibble_scales(raw, o, d, sc):
    """IQ2_XS / IQ2_S: 16 4-bit scales (low nibble first) -> d * (0.5 + s) * 0.25 (gguf's order of operations)."""
    for i in range(16):
        s = (np.int32(raw[o + (i >> 1)]) >> (4 * (i & 1))) & 15
        sc[i] = d * (np.float32(0.5) + np.float32(s)) * np.float32(0.25)


@njit(cache=CACHE)
def unpack_ternary(raw, o, vals, sc, tq1):
    """TQ1_0 (tq1: base-3 digits, 5 a byte) or TQ2_0 (2-bit fields): values q - 1 in -1..1 (TQ2_0: ..2) times the
    super-block's fp16 d."""
    d = half(raw, o + (52 if tq1 else 64))
    for i in range(16):
        sc[i] = d
    for j in range(32):
        w = np.uint64(0)
        for i in range(8):
            e = 8 * j + i
            if not tq1:
                q = (np.int32(raw[o + 32 * (e >> 7) + (e & 31)]) >> (2 * ((e >> 5) & 3))) & 3
            else:
                if e < 160:
                    byte, p = raw[o + (e & 31)], e >> 5
                elif e < 240:
                    byte, p = raw[o + 32 + ((e - 160) & 15)], (e - 160) >> 4
                else:
                    byte, p = raw[o + 48 + ((e - 240) & 3)], (e - 240) >> 2
                t = (np.int32(byte) * (3 ** p)) & 255  # the base-3 digit p rotated to the top (uint8 wrap)
                q = (t * 3) >> 8
            w |= np.uint64(q + 127) << np.uint64(8 * i)
        vals[j] = w


@njit(cache=CACHE)
def unpack_nvfp4(raw, o, vals, sc):
    for i in range(4):
        e = np.int32(raw[o + i])
        if e == 0 or e == 0x7F:
            sc[i] = np.float32(0.0)
        elif (e >> 3) & 15 == 0:
            sc[i] = np.float32(e & 7) * np.float32(2.0 ** -9) * np.float32(0.5)
        else:
            sc[i] = (np.float32(1.0) + np.float32(e & 7) / np.float32(8.0)) * \
                np.float32(2.0 ** (((e >> 3) & 15) - 7)) * np.float32(0.5)
        for h in range(2):
            w = np.uint64(0)
            for k in range(8):
                code = (np.int32(raw[o + 4 + 8 * i + k]) >> (4 * h)) & 15
                w |= np.uint64(NVFP4_KVALUES[code] + 128) << np.uint64(8 * k)
            vals[2 * i + h] = w


@njit(cache=CACHE)
def unpack_super(raw, o, fmt, vals, sc):
    """The super-block at raw[o:] of the formats not in SIGNED: vals (32 uint64) its values + 128, 8 a word
    (element i in byte i), sc (16 float32) the scale of each 16 values (NVFP4: the first 8 and 4)."""
    if fmt == NVFP4:
        unpack_nvfp4(raw, o, vals, sc)
    else:
        unpack_ternary(raw, o, vals, sc, fmt == TQ1_0)


# The formats whose points are magnitudes with separate signs: their GEMV multiplies the magnitudes (below 64, so
# unsigned bytes for vpdpbusd as they are) by the activations with the signs applied, as llama.cpp's kernels do.
SIGNED = (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)


@njit(cache=CACHE)
def signed_block(raw, o, fmt, j):
    """(magnitudes u8x32, signs u8x32 of +-1) of 32-block j of the super-block at raw[o:] (fmt in SIGNED)."""
    if fmt == IQ2_XXS:
        idx = ld32(raw, o + 2 + 8 * j)
        aux = ld32(raw, o + 6 + 8 * j)
        return (words_u8x32(GRID_IQ2XXS[idx & 255], GRID_IQ2XXS[(idx >> 8) & 255], GRID_IQ2XXS[(idx >> 16) & 255],
                            GRID_IQ2XXS[idx >> 24]),
                words_u8x32(KSIGN_PM[aux & 127], KSIGN_PM[(aux >> 7) & 127], KSIGN_PM[(aux >> 14) & 127],
                            KSIGN_PM[(aux >> 21) & 127]))
    if fmt == IQ2_XS:
        q0, q1 = ld16(raw, o + 2 + 8 * j), ld16(raw, o + 4 + 8 * j)
        q2, q3 = ld16(raw, o + 6 + 8 * j), ld16(raw, o + 8 + 8 * j)
        return (words_u8x32(GRID_IQ2XS[q0 & 511], GRID_IQ2XS[q1 & 511], GRID_IQ2XS[q2 & 511], GRID_IQ2XS[q3 & 511]),
                words_u8x32(KSIGN_PM[q0 >> 9], KSIGN_PM[q1 >> 9], KSIGN_PM[q2 >> 9], KSIGN_PM[q3 >> 9]))
    if fmt == IQ2_S:
        qh = np.uint32(ld8(raw, o + 66 + j))
        q = ld32(raw, o + 2 + 4 * j)
        sg = ld32(raw, o + 34 + 4 * j)
        return (words_u8x32(GRID_IQ2S[(q & 255) | ((qh & 3) << 8)], GRID_IQ2S[((q >> 8) & 255) | ((qh & 12) << 6)],
                            GRID_IQ2S[((q >> 16) & 255) | ((qh & 48) << 4)], GRID_IQ2S[(q >> 24) | ((qh & 192) << 2)]),
                words_u8x32(SIGN_PM[sg & 255], SIGN_PM[(sg >> 8) & 255], SIGN_PM[(sg >> 16) & 255], SIGN_PM[sg >> 24]))
    if fmt == IQ3_XXS:
        lo, hi = ld32(raw, o + 2 + 8 * j), ld32(raw, o + 6 + 8 * j)
        aux = ld32(raw, o + 66 + 4 * j)
        return (words_u8x32(pair3(GRID_IQ3XXS, lo & 255, (lo >> 8) & 255),
                            pair3(GRID_IQ3XXS, (lo >> 16) & 255, lo >> 24),
                            pair3(GRID_IQ3XXS, hi & 255, (hi >> 8) & 255),
                            pair3(GRID_IQ3XXS, (hi >> 16) & 255, hi >> 24)),
                words_u8x32(KSIGN_PM[aux & 127], KSIGN_PM[(aux >> 7) & 127], KSIGN_PM[(aux >> 14) & 127],
                            KSIGN_PM[(aux >> 21) & 127]))
    if fmt == IQ1_S:  # 11-bit indices: 8 from qs, 3 from qh's 12 low bits; qh's top bit picks the delta's sign
        qh = np.uint32(ld16(raw, o + 34 + 2 * j))
        q = ld32(raw, o + 2 + 4 * j)
        i0, i1 = (q & 255) | ((qh & 7) << 8), ((q >> 8) & 255) | (((qh >> 3) & 7) << 8)
        i2, i3 = ((q >> 16) & 255) | (((qh >> 6) & 7) << 8), (q >> 24) | (((qh >> 9) & 7) << 8)
        if qh & 0x8000:
            return (words_u8x32(GRID_IQ1_NEG_MAG[i0], GRID_IQ1_NEG_MAG[i1], GRID_IQ1_NEG_MAG[i2], GRID_IQ1_NEG_MAG[i3]),
                    words_u8x32(GRID_IQ1_NEG_SGN[i0], GRID_IQ1_NEG_SGN[i1], GRID_IQ1_NEG_SGN[i2], GRID_IQ1_NEG_SGN[i3]))
        return (words_u8x32(GRID_IQ1_POS_MAG[i0], GRID_IQ1_POS_MAG[i1], GRID_IQ1_POS_MAG[i2], GRID_IQ1_POS_MAG[i3]),
                words_u8x32(GRID_IQ1_POS_SGN[i0], GRID_IQ1_POS_SGN[i1], GRID_IQ1_POS_SGN[i2], GRID_IQ1_POS_SGN[i3]))
    if fmt == IQ1_M:  # per 8 values a nibble of qh: 3 index bits and the delta's sign
        qh = np.uint32(ld16(raw, o + 32 + 2 * j))
        q = ld32(raw, o + 4 * j)
        return (words_u8x32(iq1m_word(q, qh, 0, True), iq1m_word(q, qh, 1, True), iq1m_word(q, qh, 2, True),
                            iq1m_word(q, qh, 3, True)),
                words_u8x32(iq1m_word(q, qh, 0, False), iq1m_word(q, qh, 1, False), iq1m_word(q, qh, 2, False),
                            iq1m_word(q, qh, 3, False)))
    # IQ3_S: 8 points of 9-bit indices (qh byte j holds their high bits)
    qh = np.uint32(ld8(raw, o + 66 + j))
    lo, hi = ld32(raw, o + 2 + 8 * j), ld32(raw, o + 6 + 8 * j)
    sg = ld32(raw, o + 74 + 4 * j)
    return (words_u8x32(iq3s_pair(lo, qh), iq3s_pair(lo >> 16, qh >> 2), iq3s_pair(hi, qh >> 4),
                        iq3s_pair(hi >> 16, qh >> 6)),
            words_u8x32(SIGN_PM[sg & 255], SIGN_PM[(sg >> 8) & 255], SIGN_PM[(sg >> 16) & 255], SIGN_PM[sg >> 24]))


@njit(cache=CACHE)
def iq1m_word(q, qh, l, mag):
    """IQ1_M point l of a 32-block (index byte l of q, nibble l of qh): its magnitudes (mag) or its signs."""
    nib = (qh >> (4 * l)) & 15
    i = ((q >> (8 * l)) & 255) | ((nib & 7) << 8)
    if nib & 8:
        return GRID_IQ1_NEG_MAG[i] if mag else GRID_IQ1_NEG_SGN[i]
    return GRID_IQ1_POS_MAG[i] if mag else GRID_IQ1_POS_SGN[i]


@njit(cache=CACHE)
def iq3s_pair(q, qh):
    """Two IQ3_S points as one word: their low index bytes in q's low 16 bits, their high bits qh's bits 0 and 1."""
    return pair3(GRID_IQ3S, (q & 255) | ((qh & 1) << 8), ((q >> 8) & 255) | ((qh & 2) << 7))


@njit(cache=CACHE)
def signed_rows(row, r, ns, ts, fmt, xq, xd, accs, sc, vb):
    """accs[8 m:8 m + 8] = lane sums of activation row m against weight row r (fmt in SIGNED); vb: 512 bytes of
    scratch (a super-block's vectors, built once for every activation row)."""
    M, K = xq.shape
    acc = zero_f32x8()  # one activation row: its sums stay in a register (the same operations as through accs)
    for s in range(ns):
        o = (r * ns + s) * ts
        super_scales(row, o, fmt, sc)
        if M == 1:
            for j in range(8):
                mags, signs = signed_block(row, o, fmt, j)
                iv = dpbusd(zero_i32x8(), mags, sign_bytes(load_u8x32(xq, 256 * s + 32 * j), signs))
                acc = muladd(acc, to_f32(iv), vmul(lanes2(load_f32x8(sc, 8 * (j >> 2)), j & 3), xd[0, 8 * s + j]))
            continue
        for j in range(8):
            mags, signs = signed_block(row, o, fmt, j)
            store(vb, 64 * j, mags)
            store(vb, 64 * j + 32, signs)
        for m in range(M):
            a = load_f32x8(accs, 8 * m)
            for j in range(8):
                b = 8 * s + j
                x = sign_bytes(load_u8x32(xq, m * K + 32 * b), load_u8x32(vb, 64 * j + 32))
                iv = dpbusd(zero_i32x8(), load_u8x32(vb, 64 * j), x)
                a = muladd(a, to_f32(iv), vmul(lanes2(load_f32x8(sc, 8 * (j >> 2)), j & 3), xd[m, b]))
            store(accs, 8 * m, a)
    if M == 1:
        store(accs, 0, acc)


@njit(cache=CACHE)
def super_scales(raw, o, fmt, sc):
    """sc (16 float32): the scale of each 16 values of the super-block at raw[o:] (fmt in SIGNED)."""
    if fmt == IQ2_XS or fmt == IQ2_S:
        nibble_scales(raw, o + (66 if fmt == IQ2_XS else 74), half(raw, o), sc)
        return
    if fmt == IQ1_M:  # its fp16 d is the top nibbles of the four 16-bit scale words, which hold 3-bit scales
        s0, s1 = np.uint32(ld16(raw, o + 48)), np.uint32(ld16(raw, o + 50))
        s2, s3 = np.uint32(ld16(raw, o + 52)), np.uint32(ld16(raw, o + 54))
        d = f16_to_f32(np.uint16((s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000)))
        for i in range(16):
            s = (np.int32(ld16(raw, o + 48 + 2 * (i >> 2))) >> (3 * (i & 3))) & 7
            sc[i] = d * np.float32(2 * s + 1) * np.float32(0.125)
        return
    d = half(raw, o)
    if fmt == IQ1_S:  # values 8 g +- 1: the scale / 8 (exact)
        for ib in range(8):
            dl = d * np.float32(2 * ((np.int32(ld16(raw, o + 34 + 2 * ib)) >> 12) & 7) + 1) * np.float32(0.125)
            sc[2 * ib] = dl
            sc[2 * ib + 1] = dl
        return
    for ib in range(8):
        if fmt == IQ3_S:
            db = d * np.float32(1 + 2 * ((np.int32(raw[o + 106 + (ib >> 1)]) >> (4 * (ib & 1))) & 15))
        else:
            aux = ld32(raw, o + (2 + 8 * ib + 4 if fmt == IQ2_XXS else 66 + 4 * ib))
            db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.25 if fmt == IQ2_XXS else 0.5)
        sc[2 * ib] = db
        sc[2 * ib + 1] = db


@njit(cache=CACHE)
def block_dot(b8, sc, xq, xd, xn4, m, b, j, acc):
    """acc + row m's activations of 32-block b against the unpacked block j of the super-block in b8 / sc: an exact
    integer dot per 4 values (dpbusd_q8: the stored + 128 taken off through the offsets xn4), times the scale of
    its 16 values."""
    K = xq.shape[1]
    init = vshl(load_i32x8(xn4, m * (K // 4) + 8 * b), 7) if Q8_OFFSET else zero_i32x8()  # -128 x each 4's sum
    iv = dpbusd_q8(init, load_u8x32(b8, 32 * j), load_u8x32(xq, m * K + 32 * b))
    return muladd(acc, to_f32(iv), vmul(lanes2(load_f32x8(sc, 8 * (j >> 2)), j & 3), xd[m, b]))


@njit(parallel=True, cache=CACHE)
def grid_gemv(w, x, out, fmt):
    """out (M, N) = x (M, K) @ W^T, Q8 activations: each row's super-blocks unpacked once, then dotted with every
    activation row (the same arithmetic per output whatever M is)."""
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    N = out.shape[1]
    ts, sv = TYPE_SIZE[fmt], SUPER[fmt]
    ns, nj = K // sv, sv // 32
    for g in prange(w.shape[0]):
        vals, sc, accs = np.empty(32, np.uint64), np.empty(16, np.float32), np.empty(8 * M, np.float32)
        b8, vb = vals.view(np.uint8), np.empty(512, np.uint8)
        row = w[g]
        for r in range(min(8, N - 8 * g)):
            accs[:] = 0
            if fmt in SIGNED:
                signed_rows(row, r, ns, ts, fmt, xq, xd, accs, sc, vb)
                for m in range(M):
                    out[m, 8 * g + r] = hsum(load_f32x8(accs, 8 * m))
                continue
            for s in range(ns):
                unpack_super(row, (r * ns + s) * ts, fmt, vals, sc)
                for m in range(M):
                    acc = load_f32x8(accs, 8 * m)
                    for j in range(nj):
                        acc = block_dot(b8, sc, xq, xd, xn4, m, nj * s + j, j, acc)
                    store(accs, 8 * m, acc)
            for m in range(M):
                out[m, 8 * g + r] = hsum(load_f32x8(accs, 8 * m))


@njit(parallel=True, cache=CACHE)
def grid_deq(w, rows, out, fmt):
    """out[t] = W[rows[t]] (float32, or bf16 bits into uint16): gguf's values, scale times signed grid value."""
    K = out.shape[1]
    ts, sv = TYPE_SIZE[fmt], SUPER[fmt]
    ns = K // sv
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        vals, sc = np.empty(32, np.uint64), np.empty(16, np.float32)
        b8 = vals.view(np.uint8)
        for s in range(ns):
            if fmt in SIGNED:  # the GEMV's vectors: scale times magnitude with its sign, 32 values a store
                o = r * ns * ts + s * ts
                super_scales(w[g], o, fmt, sc)
                for j in range(8):
                    mags, signs = signed_block(w[g], o, fmt, j)
                    store(out, t * K + 256 * s + 32 * j, vmul(i8_to_f32(sign_bytes(mags, signs)),
                                                              pair16(sc[2 * j], sc[2 * j + 1])))
                continue
            unpack_super(w[g], r * ns * ts + s * ts, fmt, vals, sc)
            for j in range(sv // 8):
                q = i8_to_f32(vsub(load_u8x8(b8, 8 * j), 128))
                store(out, t * K + sv * s + 8 * j, vmul(q, sc[j >> 1]))


# One entry point per format (the registry's gemv(*packed, x, out) / dequant(*packed, rows, out) contracts).
@njit(cache=CACHE)
def gemv_iq2_xxs(w, x, out):
    grid_gemv(w, x, out, IQ2_XXS)


@njit(cache=CACHE)
def deq_iq2_xxs(w, rows, out):
    grid_deq(w, rows, out, IQ2_XXS)


@njit(cache=CACHE)
def gemv_iq2_xs(w, x, out):
    grid_gemv(w, x, out, IQ2_XS)


@njit(cache=CACHE)
def deq_iq2_xs(w, rows, out):
    grid_deq(w, rows, out, IQ2_XS)


@njit(cache=CACHE)
def gemv_iq2_s(w, x, out):
    grid_gemv(w, x, out, IQ2_S)


@njit(cache=CACHE)
def deq_iq2_s(w, rows, out):
    grid_deq(w, rows, out, IQ2_S)


@njit(cache=CACHE)
def gemv_iq3_xxs(w, x, out):
    grid_gemv(w, x, out, IQ3_XXS)


@njit(cache=CACHE)
def deq_iq3_xxs(w, rows, out):
    grid_deq(w, rows, out, IQ3_XXS)


@njit(cache=CACHE)
def gemv_iq3_s(w, x, out):
    grid_gemv(w, x, out, IQ3_S)


@njit(cache=CACHE)
def deq_iq3_s(w, rows, out):
    grid_deq(w, rows, out, IQ3_S)


@njit(cache=CACHE)
def gemv_iq1_s(w, x, out):
    grid_gemv(w, x, out, IQ1_S)


@njit(cache=CACHE)
def deq_iq1_s(w, rows, out):
    grid_deq(w, rows, out, IQ1_S)


@njit(cache=CACHE)
def gemv_iq1_m(w, x, out):
    grid_gemv(w, x, out, IQ1_M)


@njit(cache=CACHE)
def deq_iq1_m(w, rows, out):
    grid_deq(w, rows, out, IQ1_M)


@njit(cache=CACHE)
def gemv_tq1_0(w, x, out):
    grid_gemv(w, x, out, TQ1_0)


@njit(cache=CACHE)
def deq_tq1_0(w, rows, out):
    grid_deq(w, rows, out, TQ1_0)


@njit(cache=CACHE)
def gemv_tq2_0(w, x, out):
    grid_gemv(w, x, out, TQ2_0)


@njit(cache=CACHE)
def deq_tq2_0(w, rows, out):
    grid_deq(w, rows, out, TQ2_0)


@njit(cache=CACHE)
def gemv_nvfp4(w, x, out):
    grid_gemv(w, x, out, NVFP4)


@njit(cache=CACHE)
def deq_nvfp4(w, rows, out):
    grid_deq(w, rows, out, NVFP4)
