"""Q6_K with rows interleaved 8 by 8 (repack.q6_k): k_kquants_x8.py's scheme for the 6.5-bit super-block format,
its 4-row passes over an L1-resident unpacked copy of each super-block. Contracts as k_bytes.py (batch-independent
rows, gguf-equal dequantize).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .k_bytes import store_rows, store_rows4
from .k_kquants import q6k_group
from .q8act import quantize_act
from .dot import dpbusd7
from .wide import dpbusd16, load_bcast4x16, load_u8x64, pair_units, pass_rows, splat_i32x16, store16x4, unit_group
from .simd import (CACHE, PREFETCH_AHEAD_L2, concat, f16_to_f32, i8_to_f32, load_f16x8, load_f32x8, load_f32x16,
                   load_u8x8, load_u8x32, muladd, prefetch_l2, store, to_f32, vmul, vsub, zero_f32x8, zero_f32x16)
from .simd_lanes import load_bcast4, load_strided4, pair16, splat_i32


# Q6_K -------------------------------------------------------------------------------------------
# Layout (repack.q6_k), half h (128 elements) of super-block s, quad k (l = 4k..4k+3 of GGUF's 32-wide loops):
#   ql uint8 (G, ns * 1024): at 512 (2 s + h) + 64 k + 32 p + 4 r + i, GGUF's ql byte 64 h + 32 p + 4 k + i;
#   qh uint8 (G, ns * 512): at 256 (2 s + h) + 32 k + 4 r + i, GGUF's qh byte 32 h + 4 k + i;
#   sc int8 (G, ns * 128): scale of 16-group j at 128 s + 8 j + r; d uint16 (G, ns * 8): fp16 bits at 8 s + r.
# Element 128 h + 32 t + 4 k + i (t = 0..3) is q6k_group t of those bytes, minus 32.
@njit(cache=CACHE)
def q6_quads(ql, qh, o, oh):
    """The four u8x32 of 6-bit values q + 32 (t = 0..3: elements +0, +32, +64, +96) of one quad of 8 rows."""
    a = load_u8x32(ql, o)
    b = load_u8x32(ql, o + 32)
    h = load_u8x32(qh, oh)
    return q6k_group(a, b, h, 0), q6k_group(a, b, h, 1), q6k_group(a, b, h, 2), q6k_group(a, b, h, 3)


@njit(cache=CACHE)
def prefetch_half(ql, qh, sc, o, oh, so):
    for line in range(8):
        prefetch_l2(ql, o + PREFETCH_AHEAD_L2 + 64 * line)
    for line in range(4):
        prefetch_l2(qh, oh + PREFETCH_AHEAD_L2 // 2 + 64 * line)
    prefetch_l2(sc, so + PREFETCH_AHEAD_L2 // 8)


@njit(cache=CACHE)
def group16_offsets(xn4, K):
    """int32 (M, K / 16): -32 times the sum of each 16 activations' int8 values (Q6_K stores q + 32)."""
    M = xn4.shape[0]
    s = np.empty((M, K // 16), np.int32)
    for m in range(M):
        for j in range(K // 16):
            s[m, j] = 32 * (xn4[m, 4 * j] + xn4[m, 4 * j + 1] + xn4[m, 4 * j + 2] + xn4[m, 4 * j + 3])
    return s


@njit(cache=CACHE)
def q6_scale(sc, d, g, ns, s, j):
    """f32x8 per row: d * sc_j for 16-group j of super-block s."""
    return vmul(i8_to_f32(load_u8x8(sc, (g * ns + s) * 128 + 8 * j)), load_f16x8(d, (g * ns + s) * 8))


@njit(cache=CACHE)
def q6_k_pair(ql, qh, sc, d, xq, xd, o16, out, g, ns):
    """gemv_q6_k's 4-row passes over groups g and g + 1 at once (wide.py): both groups unpacked to bytes side by
    side (gemv_q6_k's 32-byte slots doubled, group g + 1 32 bytes on), and their scales worked out once, not in every
    pass (M = 512: ~5 % faster)."""
    M, K = xq.shape
    w8 = np.empty(ns * 4096, np.uint8)
    for s in range(ns):
        for h in range(2):
            for gi in range(2):
                o = (2 * ((g + gi) * ns + s) + h) * 512
                oh = (2 * ((g + gi) * ns + s) + h) * 256
                prefetch_half(ql, qh, sc, o, oh, ((g + gi) * ns + s) * 128)
                for k in range(8):
                    a = load_u8x32(ql, o + 64 * k)
                    b = load_u8x32(ql, o + 64 * k + 32)
                    hv = load_u8x32(qh, oh + 32 * k)
                    for t in range(4):
                        store(w8, 64 * (8 * (4 * (2 * s + h) + t) + k) + 32 * gi, q6k_group(a, b, hv, t))
    scl = np.empty(ns * 256, np.float32)  # both groups' d * sc of 16-group j of super-block s at 16 (16 s + j), once
    for s in range(ns):
        for j in range(16):
            store(scl, 16 * (16 * s + j), concat(q6_scale(sc, d, g, ns, s, j), q6_scale(sc, d, g + 1, ns, s, j)))
    for m in range(0, M, 4):
        m0 = min(m, M - 4)
        a0, a1, a2, a3 = zero_f32x16(), zero_f32x16(), zero_f32x16(), zero_f32x16()
        for s in range(ns):
            for h in range(2):
                for half in range(2):
                    e = s * 256 + h * 128 + 16 * half
                    j0 = e // 16
                    jl = 8 * h + half
                    for t in range(4):
                        c0, c1 = splat_i32x16(o16[m0, j0 + 2 * t]), splat_i32x16(o16[m0 + 1, j0 + 2 * t])
                        c2, c3 = splat_i32x16(o16[m0 + 2, j0 + 2 * t]), splat_i32x16(o16[m0 + 3, j0 + 2 * t])
                        for k in range(4 * half, 4 * half + 4):
                            v = load_u8x64(w8, 64 * (8 * (4 * (2 * s + h) + t) + k))
                            xo = m0 * K + s * 256 + h * 128 + 32 * t + 4 * k
                            c0 = dpbusd16(c0, v, load_bcast4x16(xq, xo))
                            c1 = dpbusd16(c1, v, load_bcast4x16(xq, xo + K))
                            c2 = dpbusd16(c2, v, load_bcast4x16(xq, xo + 2 * K))
                            c3 = dpbusd16(c3, v, load_bcast4x16(xq, xo + 3 * K))
                        sj = load_f32x16(scl, 16 * (16 * s + jl + 2 * t))
                        b32 = e // 32 + t
                        a0 = muladd(a0, to_f32(c0), vmul(sj, xd[m0, b32]))
                        a1 = muladd(a1, to_f32(c1), vmul(sj, xd[m0 + 1, b32]))
                        a2 = muladd(a2, to_f32(c2), vmul(sj, xd[m0 + 2, b32]))
                        a3 = muladd(a3, to_f32(c3), vmul(sj, xd[m0 + 3, b32]))
        store16x4(out, m0, 8 * g, a0, a1, a2, a3)


@njit(cache=CACHE)
def q6_unpack(ql, qh, sc, d, w8, scl, g, ns, s):
    """Super-block s of group g as gemv_q6_k's passes read it: its 6-bit values as bytes in w8 (2 KB; q6k_group t of
    quad k of half h at 32 (8 (4 h + t) + k)) and d * sc of its 16-groups j in scl (8 j), prefetching ahead."""
    for h in range(2):
        o = (2 * (g * ns + s) + h) * 512
        oh = (2 * (g * ns + s) + h) * 256
        prefetch_half(ql, qh, sc, o, oh, (g * ns + s) * 128)
        for k in range(8):
            a = load_u8x32(ql, o + 64 * k)
            b = load_u8x32(ql, o + 64 * k + 32)
            hv = load_u8x32(qh, oh + 32 * k)
            for t in range(4):
                store(w8, 32 * (8 * (4 * h + t) + k), q6k_group(a, b, hv, t))
    for j in range(16):
        store(scl, 8 * j, q6_scale(sc, d, g, ns, s, j))


@njit(cache=CACHE)
def q6_row_block(w8, scl, xq, xd, o16, m, s, acc):
    """acc plus activation row m's dots with super-block s unpacked by q6_unpack, in a single row's order."""
    K = xq.shape[1]
    for h in range(2):
        for half in range(2):
            e = s * 256 + h * 128 + 16 * half
            for t in range(4):
                c = splat_i32(o16[m, e // 16 + 2 * t])
                xo = m * K + e - 16 * half + 32 * t  # the activations of quad k at xo + 4 k
                for k in range(4 * half, 4 * half + 4):
                    c = dpbusd7(c, load_u8x32(w8, 32 * (8 * (4 * h + t) + k)), load_bcast4(xq, xo + 4 * k))
                acc = muladd(acc, to_f32(c), vmul(load_f32x8(scl, 8 * (8 * h + half + 2 * t)), xd[m, e // 32 + t]))
    return acc


@njit(parallel=True, cache=CACHE)
def gemv_q6_k(ql, qh, sc, d, x, out):
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    G = ql.shape[0]
    ns = K // 256
    o16 = group16_offsets(xn4, K)
    P = pair_units(M, out.shape[1])
    for u in prange(G - P):
        g = unit_group(u, P)
        if g < 2 * P:
            q6_k_pair(ql, qh, sc, d, xq, xd, o16, out, g, ns)
            continue
        if M < 4:
            for m in range(M):
                acc = zero_f32x8()
                for s in range(ns):
                    for h in range(2):
                        o = (2 * (g * ns + s) + h) * 512
                        oh = (2 * (g * ns + s) + h) * 256
                        if m == 0:
                            prefetch_half(ql, qh, sc, o, oh, (g * ns + s) * 128)
                        for half in range(2):  # quads 0..3 and 4..7: 16-groups 2 t + half
                            e = s * 256 + h * 128 + 16 * half  # first element of group t = 0
                            j0 = e // 16
                            i0, i1 = splat_i32(o16[m, j0]), splat_i32(o16[m, j0 + 2])
                            i2, i3 = splat_i32(o16[m, j0 + 4]), splat_i32(o16[m, j0 + 6])
                            for k in range(4 * half, 4 * half + 4):
                                v0, v1, v2, v3 = q6_quads(ql, qh, o + 64 * k, oh + 32 * k)
                                xo = m * K + s * 256 + h * 128 + 4 * k
                                i0 = dpbusd7(i0, v0, load_bcast4(xq, xo))
                                i1 = dpbusd7(i1, v1, load_bcast4(xq, xo + 32))
                                i2 = dpbusd7(i2, v2, load_bcast4(xq, xo + 64))
                                i3 = dpbusd7(i3, v3, load_bcast4(xq, xo + 96))
                            jl = 8 * h + half  # group index within the super-block for t = 0
                            acc = muladd(acc, to_f32(i0), vmul(q6_scale(sc, d, g, ns, s, jl), xd[m, e // 32]))
                            acc = muladd(acc, to_f32(i1), vmul(q6_scale(sc, d, g, ns, s, jl + 2), xd[m, e // 32 + 1]))
                            acc = muladd(acc, to_f32(i2), vmul(q6_scale(sc, d, g, ns, s, jl + 4), xd[m, e // 32 + 2]))
                            acc = muladd(acc, to_f32(i3), vmul(q6_scale(sc, d, g, ns, s, jl + 6), xd[m, e // 32 + 3]))
                store_rows(out, m, 8 * g, acc)
            continue
        # Super-block by super-block: q6_unpack's bytes and scales (2.5 KB, L1-resident), then every 4-row pass over
        # the first M4 rows (wide.pass_rows) and the rest one at a time. The accumulators wait in acc between
        # super-blocks (pass p's rows at slots 4 p.., then the single rows), so each row sums in a single row's order.
        M4 = pass_rows(M)
        P4 = (M4 + 3) // 4
        acc = np.zeros((4 * P4 + M - M4) * 8, np.float32)
        w8, scl = np.empty(2048, np.uint8), np.empty(128, np.float32)
        for s in range(ns):
            q6_unpack(ql, qh, sc, d, w8, scl, g, ns, s)
            for p in range(P4):  # inline: see k_bytes.gemv_q8_0
                m0 = min(4 * p, M4 - 4)
                a0, a1 = load_f32x8(acc, 32 * p), load_f32x8(acc, 32 * p + 8)
                a2, a3 = load_f32x8(acc, 32 * p + 16), load_f32x8(acc, 32 * p + 24)
                for h in range(2):
                    for half in range(2):
                        e = s * 256 + h * 128 + 16 * half
                        j0 = e // 16
                        for t in range(4):  # one 16-group of each row per pass: 4 chains, 4 activation rows
                            c0, c1 = splat_i32(o16[m0, j0 + 2 * t]), splat_i32(o16[m0 + 1, j0 + 2 * t])
                            c2, c3 = splat_i32(o16[m0 + 2, j0 + 2 * t]), splat_i32(o16[m0 + 3, j0 + 2 * t])
                            for k in range(4 * half, 4 * half + 4):
                                v = load_u8x32(w8, 32 * (8 * (4 * h + t) + k))
                                xo = m0 * K + s * 256 + h * 128 + 32 * t + 4 * k
                                c0 = dpbusd7(c0, v, load_bcast4(xq, xo))
                                c1 = dpbusd7(c1, v, load_bcast4(xq, xo + K))
                                c2 = dpbusd7(c2, v, load_bcast4(xq, xo + 2 * K))
                                c3 = dpbusd7(c3, v, load_bcast4(xq, xo + 3 * K))
                            sj = load_f32x8(scl, 8 * (8 * h + half + 2 * t))
                            b32 = e // 32 + t
                            a0 = muladd(a0, to_f32(c0), vmul(sj, xd[m0, b32]))
                            a1 = muladd(a1, to_f32(c1), vmul(sj, xd[m0 + 1, b32]))
                            a2 = muladd(a2, to_f32(c2), vmul(sj, xd[m0 + 2, b32]))
                            a3 = muladd(a3, to_f32(c3), vmul(sj, xd[m0 + 3, b32]))
                store(acc, 32 * p, a0)
                store(acc, 32 * p + 8, a1)
                store(acc, 32 * p + 16, a2)
                store(acc, 32 * p + 24, a3)
            for m in range(M4, M):
                o = 8 * (4 * P4 + m - M4)
                store(acc, o, q6_row_block(w8, scl, xq, xd, o16, m, s, load_f32x8(acc, o)))
        for p in range(P4):
            m0 = min(4 * p, M4 - 4)
            store_rows4(out, m0, 8 * g, load_f32x8(acc, 32 * p), load_f32x8(acc, 32 * p + 8),
                        load_f32x8(acc, 32 * p + 16), load_f32x8(acc, 32 * p + 24))
        for m in range(M4, M):
            store_rows(out, m, 8 * g, load_f32x8(acc, 8 * (4 * P4 + m - M4)))


@njit(parallel=True, cache=CACHE)
def deq_q6_k(ql, qh, sc, d, rows, out):
    K = out.shape[1]
    ns = K // 256
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        for s in range(ns):
            dd = f16_to_f32(d[g, 8 * s + r])
            for h in range(2):
                o = (2 * (g * ns + s) + h) * 512 + 4 * r
                qa = load_strided4(ql, o, 64)  # GGUF's ql, qh bytes of this half, in order
                qb = load_strided4(ql, o + 32, 64)
                hv = load_strided4(qh, (2 * (g * ns + s) + h) * 256 + 4 * r, 32)
                for k in range(4):
                    j = s * 16 + h * 8 + 2 * k
                    scale = pair16(dd * np.float32(np.int8(sc[g, 128 * s + 8 * (j % 16) + r])),
                                   dd * np.float32(np.int8(sc[g, 128 * s + 8 * (j % 16 + 1) + r])))
                    q = i8_to_f32(vsub(q6k_group(qa, qb, hv, k), 32))
                    store(out, t * K + j * 16, vmul(q, scale))
