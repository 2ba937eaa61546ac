"""Kernels for Q8_0, Q5_0 and Q4_0 with rows interleaved 8 by 8.

Q8_0 layout (repack.q8_0): q uint8 (G, nb * 256), G = ceil(N / 8): for row group g, block b, quad j, row r, byte i,
q[g, 256 b + 32 j + 4 r + i] = value(8 g + r, 32 b + 4 j + i) + 128; d uint16 (G, nb * 8): the fp16 scale of
(8 g + r, b) at d[g, 8 b + r]. Rows past N are zero. One vpdpbusd then multiplies an activation quad (broadcast)
by the same quad of 8 rows, so each int32 lane is one output row: no horizontal sums, and a block's weights
loaded once serve 4 activation rows (a 16-row step over the 262144 x 640 output matrix 3.3x faster than one row
at a time).
Q5_0 layout (repack.q5_0), packed as in the file (decode reads 22 bytes per 32 values, not 32): qs uint8
(G, nb * 128): at 128 b + 32 k + 4 r + i GGUF's qs byte 4 k + i of row r (low nibble: element 4 k + i, high:
element 16 + 4 k + i), k = 0..3; qh uint32 (G, nb * 8): word 8 b + k has bit 4 r + i = the fifth bit of element
4 k + i of row r (k = 0..7); d as Q8_0. Value = d * (q - 16).
Q4_0 layout (repack.q4_0): Q5_0's qs and d without qh; value = d * (q - 8). Its passes are Q5_0's (high=False: no
fifth bit; the block dots start at -8 times the activation sum), so GPTQ-Int4 checkpoints (hf_int.py) and Q4_0
files run on the interleaved VNNI passes, not one row at a time.

gemv(packed..., x f32 (M, K), out f32 (M, N)): out = x @ W^T with Q8 activations; a row's result is bitwise the
same whatever M is (the integer block dots are exact, the float steps identical). deq(packed..., rows, out f32 or
uint16 bf16 bits (T, K)): out[t] = W[rows[t]] with gguf's float32 operations.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .q8act import quantize_act
from .dot import Q8_OFFSET, acc_i32, dpbusd_acc, dpbusd_q8, zero_acc
from .simd import (CACHE, PREFETCH_AHEAD, bits_to_bytes, concat, f16_to_f32, i8_to_f32, load_f16x8, load_u8x32, muladd,
                   prefetch, store, to_f32, vadd, vand, vmul, vor, vshl, vshr, vsub, zero_f32x8, zero_f32x16)
from .simd_lanes import lane, load_bcast4, load_strided4, load_strided4x4, splat_i32
from .wide import (byte_pair_passes, dpbusd16, five_rows, load_bcast4x16, pair_units, pass_rows, rows_back,
                   splat_i32x16, store16x4, three_as_four, unit_group)


@njit(cache=CACHE)
def block_offsets(xn4, nb, offset):
    """int32 (M, nb): -offset times the sum of each activation block's int8 values, the start of a block's
    integer dot (the weights are stored value + offset)."""
    M = xn4.shape[0]
    s = np.empty((M, nb), np.int32)
    for m in range(M):
        for b in range(nb):
            t = 0
            for j in range(8):
                t += xn4[m, 8 * b + j]
            s[m, b] = offset * t
    return s


# Q8_0 reads 2x PREFETCH_AHEAD ahead: on the 262144 x 640 output matrix (A/B, interleaved, 30 calls) 4096 bytes
# with four chains took 4.04-4.22 ms against 4.70-4.83 at 2048 with two; 6144 and 8192 were slower again.
Q8_AHEAD = 2 * PREFETCH_AHEAD


@njit(cache=CACHE)
def prefetch_block(q, d, g, nb, b):
    for line in range(4):
        prefetch(q, (g * nb + b) * 256 + Q8_AHEAD + 64 * line)
    prefetch(d, (g * nb + b) * 8 + Q8_AHEAD // 32)


@njit(cache=CACHE)
def dot_one(q, o, xq, xo, init):
    """One block of 8 rows against one activation row, in four chains (vpdpbusd's latency)."""
    a, c, e, f = init, splat_i32(0), splat_i32(0), splat_i32(0)
    for j in range(0, 8, 4):
        a = dpbusd_q8(a, load_u8x32(q, o + 32 * j), load_bcast4(xq, xo + 4 * j))
        c = dpbusd_q8(c, load_u8x32(q, o + 32 * j + 32), load_bcast4(xq, xo + 4 * j + 4))
        e = dpbusd_q8(e, load_u8x32(q, o + 32 * j + 64), load_bcast4(xq, xo + 4 * j + 8))
        f = dpbusd_q8(f, load_u8x32(q, o + 32 * j + 96), load_bcast4(xq, xo + 4 * j + 12))
    return vadd(vadd(a, c), vadd(e, f))


@njit(cache=CACHE)
def store_rows(out, m, n0, acc):
    """out[m, n0:n0 + 8] = acc, the lanes past N dropped."""
    N = out.shape[1]
    if n0 + 8 <= N:
        store(out, m * N + n0, acc)
    else:
        for j in range(N - n0):
            out[m, n0 + j] = lane(acc, j)


@njit(cache=CACHE)
def store_rows4(out, m0, n0, a0, a1, a2, a3):
    """store_rows for activation rows m0..m0 + 3 (a 4-row pass)."""
    store_rows(out, m0, n0, a0)
    store_rows(out, m0 + 1, n0, a1)
    store_rows(out, m0 + 2, n0, a2)
    store_rows(out, m0 + 3, n0, a3)


@njit(cache=CACHE)
def q8_0_pair(q, d, xq, xd, s, out, g, nb, M4):
    """gemv_q8_0's 4-row passes over the first M4 activation rows (wide.pass_rows) and groups g and g + 1 at once
    (wide.py): the same integers, the same bits. PAIR hosts only: s holds the offsets of Q8_OFFSET = 128, which
    dpbusd16 (an exact dot) needs."""
    K = xq.shape[1]
    for m in range(0, M4, 4):
        m0 = min(m, M4 - 4)
        a0, a1, a2, a3 = zero_f32x16(), zero_f32x16(), zero_f32x16(), zero_f32x16()
        for b in range(nb):
            o = (g * nb + b) * 256
            o2 = o + nb * 256
            if m == 0:
                prefetch_block(q, d, g, nb, b)
                prefetch_block(q, d, g + 1, nb, b)
            dw = concat(load_f16x8(d, (g * nb + b) * 8), load_f16x8(d, ((g + 1) * nb + b) * 8))
            i0, i1 = splat_i32x16(s[m0, b]), splat_i32x16(s[m0 + 1, b])
            i2, i3 = splat_i32x16(s[m0 + 2, b]), splat_i32x16(s[m0 + 3, b])
            x0 = m0 * K + b * 32
            for j in range(8):
                w = concat(load_u8x32(q, o + 32 * j), load_u8x32(q, o2 + 32 * j))
                i0 = dpbusd16(i0, w, load_bcast4x16(xq, x0 + 4 * j))
                i1 = dpbusd16(i1, w, load_bcast4x16(xq, x0 + K + 4 * j))
                i2 = dpbusd16(i2, w, load_bcast4x16(xq, x0 + 2 * K + 4 * j))
                i3 = dpbusd16(i3, w, load_bcast4x16(xq, x0 + 3 * K + 4 * j))
            a0 = muladd(a0, to_f32(i0), vmul(dw, xd[m0, b]))
            a1 = muladd(a1, to_f32(i1), vmul(dw, xd[m0 + 1, b]))
            a2 = muladd(a2, to_f32(i2), vmul(dw, xd[m0 + 2, b]))
            a3 = muladd(a3, to_f32(i3), vmul(dw, xd[m0 + 3, b]))
        store16x4(out, m0, 8 * g, a0, a1, a2, a3)


@njit(cache=CACHE)
def q8_0_five(q, d, xq, xd, s, out, g, nb, m0):
    """gemv_q8_0's 4-row pass with a fifth row (rows m0..m0 + 4 over group g; wide.five_rows): the same integers and
    float steps per row."""
    K = xq.shape[1]
    a0, a1, a2, a3, a4 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
    for b in range(nb):
        o = (g * nb + b) * 256
        prefetch_block(q, d, g, nb, b)
        dw = load_f16x8(d, (g * nb + b) * 8)
        i0, i1, i2 = splat_i32(s[m0, b]), splat_i32(s[m0 + 1, b]), splat_i32(s[m0 + 2, b])
        i3, i4 = splat_i32(s[m0 + 3, b]), splat_i32(s[m0 + 4, b])
        x0 = m0 * K + b * 32
        for j in range(8):
            w = load_u8x32(q, o + 32 * j)
            i0 = dpbusd_q8(i0, w, load_bcast4(xq, x0 + 4 * j))
            i1 = dpbusd_q8(i1, w, load_bcast4(xq, x0 + K + 4 * j))
            i2 = dpbusd_q8(i2, w, load_bcast4(xq, x0 + 2 * K + 4 * j))
            i3 = dpbusd_q8(i3, w, load_bcast4(xq, x0 + 3 * K + 4 * j))
            i4 = dpbusd_q8(i4, w, load_bcast4(xq, x0 + 4 * K + 4 * j))
        a0 = muladd(a0, to_f32(i0), vmul(dw, xd[m0, b]))
        a1 = muladd(a1, to_f32(i1), vmul(dw, xd[m0 + 1, b]))
        a2 = muladd(a2, to_f32(i2), vmul(dw, xd[m0 + 2, b]))
        a3 = muladd(a3, to_f32(i3), vmul(dw, xd[m0 + 3, b]))
        a4 = muladd(a4, to_f32(i4), vmul(dw, xd[m0 + 4, b]))
    store_rows4(out, m0, 8 * g, a0, a1, a2, a3)
    store_rows(out, m0 + 4, 8 * g, a4)


@njit(parallel=True, cache=CACHE)
def gemv_q8_0(q, d, x, out_):
    x, out = three_as_four(x, out_, True)
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    G, N = q.shape[0], out.shape[1]
    nb = K // 32
    s = block_offsets(xn4, nb, Q8_OFFSET)
    P = pair_units(M, N)
    M4 = pass_rows(M)
    five = five_rows(M)
    for u in prange(G - P):
        g = unit_group(u, P)
        if g < 2 * P:
            q8_0_pair(q, d, xq, xd, s, out, g, nb, M4)
        # 4 activation rows per pass over the first M4 rows (wide.pass_rows; a last pass moved back to end at M4
        # recomputes its overlap, bitwise equal), or up to the last 5 rows, which one pass takes (wide.five_rows).
        # Inline on purpose: as a function returning the four accumulators it ran 15-20 % slower.
        for m in range(0, (M - 5 if five else M4) if g >= 2 * P else 0, 4):
            m0 = min(m, M4 - 4)
            a0, a1, a2, a3 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
            for b in range(nb):
                o = (g * nb + b) * 256
                if m == 0:
                    prefetch_block(q, d, g, nb, b)
                dw = load_f16x8(d, (g * nb + b) * 8)
                i0, i1 = splat_i32(s[m0, b]), splat_i32(s[m0 + 1, b])
                i2, i3 = splat_i32(s[m0 + 2, b]), splat_i32(s[m0 + 3, b])
                x0 = m0 * K + b * 32
                for j in range(8):
                    w = load_u8x32(q, o + 32 * j)
                    i0 = dpbusd_q8(i0, w, load_bcast4(xq, x0 + 4 * j))
                    i1 = dpbusd_q8(i1, w, load_bcast4(xq, x0 + K + 4 * j))
                    i2 = dpbusd_q8(i2, w, load_bcast4(xq, x0 + 2 * K + 4 * j))
                    i3 = dpbusd_q8(i3, w, load_bcast4(xq, x0 + 3 * K + 4 * j))
                a0 = muladd(a0, to_f32(i0), vmul(dw, xd[m0, b]))
                a1 = muladd(a1, to_f32(i1), vmul(dw, xd[m0 + 1, b]))
                a2 = muladd(a2, to_f32(i2), vmul(dw, xd[m0 + 2, b]))
                a3 = muladd(a3, to_f32(i3), vmul(dw, xd[m0 + 3, b]))
            store_rows4(out, m0, 8 * g, a0, a1, a2, a3)
        if five and g >= 2 * P:
            q8_0_five(q, d, xq, xd, s, out, g, nb, M - 5)
        # The rows past the passes (every row below 4) one at a time over each group of the unit, whose weights the
        # passes left in cache. Inline: as a function call gemma-3-270m's decode ran 3-4 % slower.
        for g1 in range(g, g + (2 if g < 2 * P else 1)):
            for m in range(M if five and g >= 2 * P else M4, M):
                acc = zero_f32x8()
                for b in range(nb):
                    if m == 0:
                        prefetch_block(q, d, g1, nb, b)
                    iv = dot_one(q, (g1 * nb + b) * 256, xq, m * K + b * 32, splat_i32(s[m, b]))
                    acc = muladd(acc, to_f32(iv), vmul(load_f16x8(d, (g1 * nb + b) * 8), xd[m, b]))
                store_rows(out, m, 8 * g1, acc)
    rows_back(out_, out)


@njit(parallel=True, cache=CACHE)
def deq_q8_0(q, d, rows, out):
    K = out.shape[1]
    nb = K // 32
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        for b in range(nb):
            v = i8_to_f32(vsub(load_strided4(q, (g * nb + b) * 256 + 4 * r, 32), 128))
            store(out, t * K + b * 32, vmul(v, f16_to_f32(d[g, 8 * b + r])))


# Q5_0 -------------------------------------------------------------------------------------------
@njit(cache=CACHE)
def q5_quads(qs, qh, g, nb, b, k, high):
    """u8x32 of 5-bit values (8 rows x 4) of quads k and k + 4 of block b (k = 0..3); high False: the 4-bit values
    alone (Q4_0, qh unused)."""
    v = load_u8x32(qs, (g * nb + b) * 128 + 32 * k)
    if not high:
        return vand(v, 15), vshr(v, 4)
    lo = vor(vand(v, 15), vshl(bits_to_bytes(qh[g, 8 * b + k]), 4))
    hi = vor(vshr(v, 4), vshl(bits_to_bytes(qh[g, 8 * b + k + 4]), 4))
    return lo, hi


@njit(cache=CACHE)
def prefetch_q5(qs, qh, d, g, nb, b, high):
    prefetch(qs, (g * nb + b) * 128 + PREFETCH_AHEAD)
    prefetch(qs, (g * nb + b) * 128 + PREFETCH_AHEAD + 64)
    if high:  # Q4_0's qh is a placeholder: prefetches past it would walk page tables for nothing
        prefetch(qh, (g * nb + b) * 8 + PREFETCH_AHEAD // 16)
    prefetch(d, (g * nb + b) * 8 + PREFETCH_AHEAD // 16)


@njit(cache=CACHE)
def q5_0_pair(qs, qh, d, xq, xd, s, out, g, nb, high):
    """gemv_q5_0's 4-row passes over groups g and g + 1 at once (wide.py): both groups unpacked to bytes side by
    side (quads k and k + 4 of block b at 512 b + 64 k and 512 b + 256 + 64 k, group g + 1 32 bytes on)."""
    w8, dw = np.empty(nb * 512, np.uint8), np.empty(nb * 16, np.float32)
    for b in range(nb):
        prefetch_q5(qs, qh, d, g, nb, b, high)
        prefetch_q5(qs, qh, d, g + 1, nb, b, high)
        for k in range(4):
            for h in range(2):
                lo, hi = q5_quads(qs, qh, g + h, nb, b, k, high)
                store(w8, b * 512 + 64 * k + 32 * h, lo)
                store(w8, b * 512 + 256 + 64 * k + 32 * h, hi)
        store(dw, 16 * b, concat(load_f16x8(d, (g * nb + b) * 8), load_f16x8(d, ((g + 1) * nb + b) * 8)))
    byte_pair_passes(w8, dw, xq, xd, s, out, g, nb)


@njit(cache=CACHE)
def q5_0_rows(qs, qh, w8, d, xq, xd, s, out, g, nb, high, m_start, m_end):
    """nibble_passes' activation rows m_start..m_end - 1 past its 4-row passes, one at a time over group g, reading
    Q5_0's values from the bytes w8 the passes unpacked (high) and Q4_0's nibbles in place."""
    K = xq.shape[1]
    for m in range(m_start, m_end):
        acc = zero_f32x8()
        for b in range(nb):
            xo = m * K + b * 32
            a, c = zero_acc(), zero_acc()  # short accumulators: 4 dots of 5-bit weights each
            for k in range(4):
                if high:
                    lo, hi = load_u8x32(w8, b * 256 + 32 * k), load_u8x32(w8, b * 256 + 32 * k + 128)
                else:
                    lo, hi = q5_quads(qs, qh, g, nb, b, k, high)
                a = dpbusd_acc(a, lo, load_bcast4(xq, xo + 4 * k))
                c = dpbusd_acc(c, hi, load_bcast4(xq, xo + 16 + 4 * k))
            iv = vadd(splat_i32(s[m, b]), vadd(acc_i32(a), acc_i32(c)))
            acc = muladd(acc, to_f32(iv), vmul(load_f16x8(d, (g * nb + b) * 8), xd[m, b]))
        store_rows(out, m, 8 * g, acc)


@njit(cache=CACHE, inline="always")
def q5_step(a, i, h, s, xd, dw, m, b):
    """One row's block of a nibble pass: its two short accumulators, the offset start, times d * xd."""
    return muladd(a, to_f32(vadd(splat_i32(s[m, b]), vadd(acc_i32(i), acc_i32(h)))), vmul(dw, xd[m, b]))


@njit(cache=CACHE)
def q5_0_five(qs, qh, w8, d, xq, xd, s, out, g, nb, high, m0):
    """nibble_passes' 4-row pass with a fifth row (rows m0..m0 + 4 over group g; wide.five_rows): the same integers
    and float steps per row."""
    K = xq.shape[1]
    a0, a1, a2, a3, a4 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
    for b in range(nb):
        if not high:
            prefetch_q5(qs, qh, d, g, nb, b, high)
        i0, i1, i2, i3, i4 = zero_acc(), zero_acc(), zero_acc(), zero_acc(), zero_acc()
        h0, h1, h2, h3, h4 = zero_acc(), zero_acc(), zero_acc(), zero_acc(), zero_acc()
        x0 = m0 * K + b * 32
        for k in range(4):
            if high:
                lo, hi = load_u8x32(w8, b * 256 + 32 * k), load_u8x32(w8, b * 256 + 32 * k + 128)
            else:
                lo, hi = q5_quads(qs, qh, g, nb, b, k, high)
            i0 = dpbusd_acc(i0, lo, load_bcast4(xq, x0 + 4 * k))
            i1 = dpbusd_acc(i1, lo, load_bcast4(xq, x0 + K + 4 * k))
            i2 = dpbusd_acc(i2, lo, load_bcast4(xq, x0 + 2 * K + 4 * k))
            i3 = dpbusd_acc(i3, lo, load_bcast4(xq, x0 + 3 * K + 4 * k))
            i4 = dpbusd_acc(i4, lo, load_bcast4(xq, x0 + 4 * K + 4 * k))
            h0 = dpbusd_acc(h0, hi, load_bcast4(xq, x0 + 16 + 4 * k))
            h1 = dpbusd_acc(h1, hi, load_bcast4(xq, x0 + K + 16 + 4 * k))
            h2 = dpbusd_acc(h2, hi, load_bcast4(xq, x0 + 2 * K + 16 + 4 * k))
            h3 = dpbusd_acc(h3, hi, load_bcast4(xq, x0 + 3 * K + 16 + 4 * k))
            h4 = dpbusd_acc(h4, hi, load_bcast4(xq, x0 + 4 * K + 16 + 4 * k))
        dw = load_f16x8(d, (g * nb + b) * 8)
        a0 = q5_step(a0, i0, h0, s, xd, dw, m0, b)
        a1 = q5_step(a1, i1, h1, s, xd, dw, m0 + 1, b)
        a2 = q5_step(a2, i2, h2, s, xd, dw, m0 + 2, b)
        a3 = q5_step(a3, i3, h3, s, xd, dw, m0 + 3, b)
        a4 = q5_step(a4, i4, h4, s, xd, dw, m0 + 4, b)
    store_rows4(out, m0, 8 * g, a0, a1, a2, a3)
    store_rows(out, m0 + 4, 8 * g, a4)


@njit(cache=CACHE)
def gemv_q5_0(qs, qh, d, x, out):
    nibble_passes(qs, qh, d, x, out, True)


@njit(cache=CACHE)
def gemv_q4_0(qs, d, x, out):
    nibble_passes(qs, np.zeros((1, 1), np.uint32), d, x, out, False)


@njit(parallel=True, cache=CACHE)
def nibble_passes(qs, qh, d, x_, out_, high):
    """Q5_0's GEMV (high: qh holds the fifth bits) or Q4_0's (not high: qh unused)."""
    x, out = three_as_four(x_, out_, not high)
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    G = qs.shape[0]
    nb = K // 32
    s = block_offsets(xn4, nb, 16 if high else 8)
    P = pair_units(M, out.shape[1])
    M4 = pass_rows(M)
    five = five_rows(M)
    for u in prange(G - P):
        g = unit_group(u, P)
        if g < 2 * P:
            q5_0_pair(qs, qh, d, xq, xd, s, out, g, nb, high)
            continue
        if M < 4:  # inline: as a q5_0_rows call the decode GEMV ran 5-8 % slower
            for m in range(M):
                acc = zero_f32x8()
                for b in range(nb):
                    if m == 0:
                        prefetch_q5(qs, qh, d, g, nb, b, high)
                    xo = m * K + b * 32
                    a, c = zero_acc(), zero_acc()  # short accumulators: 4 dots of 5-bit weights each
                    for k in range(4):
                        lo, hi = q5_quads(qs, qh, g, nb, b, k, high)
                        a = dpbusd_acc(a, lo, load_bcast4(xq, xo + 4 * k))
                        c = dpbusd_acc(c, hi, load_bcast4(xq, xo + 16 + 4 * k))
                    iv = vadd(splat_i32(s[m, b]), vadd(acc_i32(a), acc_i32(c)))
                    acc = muladd(acc, to_f32(iv), vmul(load_f16x8(d, (g * nb + b) * 8), xd[m, b]))
                store_rows(out, m, 8 * g, acc)
            continue
        # Q5_0's 5-bit values unpacked to bytes once (quads k and k + 4 of block b at 256 b + 32 k and
        # 256 b + 32 (k + 4)); every 4-row pass then reads bytes, not bits. Q4_0's passes split their nibbles in
        # place (two instructions a quad: cheaper than a round trip through the buffer).
        w8 = np.empty(nb * 256 if high else 0, np.uint8)
        for b in range(nb if high else 0):
            prefetch_q5(qs, qh, d, g, nb, b, high)
            for k in range(4):
                lo, hi = q5_quads(qs, qh, g, nb, b, k, high)
                store(w8, b * 256 + 32 * k, lo)
                store(w8, b * 256 + 32 * k + 128, hi)
        for m in range(0, M - 5 if five else M4, 4):  # as gemv_q8_0
            m0 = min(m, M4 - 4)
            a0, a1, a2, a3 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
            for b in range(nb):
                if m == 0 and not high:
                    prefetch_q5(qs, qh, d, g, nb, b, high)
                # Short accumulators: 4 dots of 5-bit weights each (dot.ACC_TYPE).
                i0, i1, i2, i3 = zero_acc(), zero_acc(), zero_acc(), zero_acc()
                h0, h1, h2, h3 = zero_acc(), zero_acc(), zero_acc(), zero_acc()
                x0 = m0 * K + b * 32
                for k in range(4):
                    if high:
                        lo, hi = load_u8x32(w8, b * 256 + 32 * k), load_u8x32(w8, b * 256 + 32 * k + 128)
                    else:
                        lo, hi = q5_quads(qs, qh, g, nb, b, k, high)
                    i0 = dpbusd_acc(i0, lo, load_bcast4(xq, x0 + 4 * k))
                    i1 = dpbusd_acc(i1, lo, load_bcast4(xq, x0 + K + 4 * k))
                    i2 = dpbusd_acc(i2, lo, load_bcast4(xq, x0 + 2 * K + 4 * k))
                    i3 = dpbusd_acc(i3, lo, load_bcast4(xq, x0 + 3 * K + 4 * k))
                    h0 = dpbusd_acc(h0, hi, load_bcast4(xq, x0 + 16 + 4 * k))
                    h1 = dpbusd_acc(h1, hi, load_bcast4(xq, x0 + K + 16 + 4 * k))
                    h2 = dpbusd_acc(h2, hi, load_bcast4(xq, x0 + 2 * K + 16 + 4 * k))
                    h3 = dpbusd_acc(h3, hi, load_bcast4(xq, x0 + 3 * K + 16 + 4 * k))
                dw = load_f16x8(d, (g * nb + b) * 8)
                a0 = q5_step(a0, i0, h0, s, xd, dw, m0, b)
                a1 = q5_step(a1, i1, h1, s, xd, dw, m0 + 1, b)
                a2 = q5_step(a2, i2, h2, s, xd, dw, m0 + 2, b)
                a3 = q5_step(a3, i3, h3, s, xd, dw, m0 + 3, b)
            store_rows4(out, m0, 8 * g, a0, a1, a2, a3)
        if five:
            q5_0_five(qs, qh, w8, d, xq, xd, s, out, g, nb, high, M - 5)
        q5_0_rows(qs, qh, w8, d, xq, xd, s, out, g, nb, high, M if five else M4, M)
    rows_back(out_, out)


@njit(parallel=True, cache=CACHE)
def deq_q4_0(qs, d, rows, out):
    K = out.shape[1]
    nb = K // 32
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        for b in range(nb):
            v = load_strided4x4(qs, (g * nb + b) * 128 + 4 * r, 32)  # GGUF's 16 qs bytes of the row
            q = concat(vand(v, 15), vshr(v, 4))
            store(out, t * K + b * 32, vmul(i8_to_f32(vsub(q, 8)), f16_to_f32(d[g, 8 * b + r])))


@njit(parallel=True, cache=CACHE)
def deq_q5_0(qs, qh, d, rows, out):
    K = out.shape[1]
    nb = K // 32
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        for b in range(nb):
            v = load_strided4x4(qs, (g * nb + b) * 128 + 4 * r, 32)  # GGUF's 16 qs bytes of the row
            h = np.uint32(0)
            for k in range(8):
                h |= ((qh[g, 8 * b + k] >> np.uint32(4 * r)) & np.uint32(15)) << np.uint32(4 * k)
            q = vor(concat(vand(v, 15), vshr(v, 4)), vshl(bits_to_bytes(h), 4))
            store(out, t * K + b * 32, vmul(i8_to_f32(vsub(q, 16)), f16_to_f32(d[g, 8 * b + r])))
