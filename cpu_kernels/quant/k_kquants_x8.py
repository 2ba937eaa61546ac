"""Q4_K with rows interleaved 8 by 8: k_bytes.py's scheme (one int32 lane per weight row, activation quads
broadcast, 4 activation rows per weight load) for the 4.5-bit super-block format.

Layout (repack.q4_k), G = ceil(N / 8), ns = K / 256, row r of group g:
  qs uint8 (G, ns * 1024): super-block s, chunk c (64 elements), quad k, row r, byte i at
      1024 s + 256 c + 32 k + 4 r + i holds GGUF's byte 4 k + i of that chunk: low nibble = element
      64 c + 4 k + i (group 2 c), high nibble = element 64 c + 32 + 4 k + i (group 2 c + 1);
  sc, mn uint8 (G, ns * 64): the 6-bit scale and min of group j at 64 s + 8 j + r;
  d, dmin uint16 (G, ns * 8): fp16 bits at 8 s + r.
Value = d * sc_j * q - dmin * mn_j. Contracts as k_bytes.py (batch-independent rows, gguf-equal dequantize).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .k_bytes import store_rows
from .q8act import quantize_act
from .simd import (CACHE, PREFETCH_AHEAD, dpbusd, f16_to_f32, load_bcast4, load_f16x8, load_strided4, load_u8x8,
                   load_u8x32, muladd, prefetch, store, to_f32, u8_to_f32, vadd, vand, vmul, vshr, vsub, zero_f32x8,
                   zero_i32x8)


@njit(cache=CACHE)
def group_scales(sc, mn, d, dmin, g, ns, s, j):
    """f32x8 per row: d * sc_j and dmin * mn_j of group j of super-block s."""
    o = (g * ns + s) * 64 + 8 * j
    return (vmul(u8_to_f32(load_u8x8(sc, o)), load_f16x8(d, (g * ns + s) * 8)),
            vmul(u8_to_f32(load_u8x8(mn, o)), load_f16x8(dmin, (g * ns + s) * 8)))


@njit(cache=CACHE)
def prefetch_chunk(qs, sc, mn, d, dmin, o, so):
    """Read hints PREFETCH_AHEAD bytes past chunk o of qs, and as far ahead in the scale streams (so: the
    chunk's position in sc's units): their misses, not prefetched, held Q4_K at 23 GB/s from DRAM."""
    for line in range(4):
        prefetch(qs, o + PREFETCH_AHEAD + 64 * line)
    prefetch(sc, so + PREFETCH_AHEAD // 16)
    prefetch(mn, so + PREFETCH_AHEAD // 16)
    prefetch(d, so // 8 + PREFETCH_AHEAD // 128)
    prefetch(dmin, so // 8 + PREFETCH_AHEAD // 128)


@njit(parallel=True, cache=CACHE)
def gemv_q4_k(qs, sc, mn, d, dmin, x, out):
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    G = qs.shape[0]
    ns = K // 256
    for g in prange(G):
        if M < 4:
            for m in range(M):
                acc = zero_f32x8()
                for s in range(ns):
                    for c in range(4):
                        o = (g * ns + s) * 1024 + 256 * c
                        if m == 0:
                            prefetch_chunk(qs, sc, mn, d, dmin, o, (g * ns + s) * 64 + c * 16)
                        xo = m * K + s * 256 + 64 * c
                        ia, ib, ja_, jb = zero_i32x8(), zero_i32x8(), zero_i32x8(), zero_i32x8()
                        for k in range(0, 8, 2):  # four chains: vpdpbusd's latency
                            w = load_u8x32(qs, o + 32 * k)
                            ia = dpbusd(ia, vand(w, 15), load_bcast4(xq, xo + 4 * k))
                            ib = dpbusd(ib, vshr(w, 4), load_bcast4(xq, xo + 32 + 4 * k))
                            w = load_u8x32(qs, o + 32 * k + 32)
                            ja_ = dpbusd(ja_, vand(w, 15), load_bcast4(xq, xo + 4 * k + 4))
                            jb = dpbusd(jb, vshr(w, 4), load_bcast4(xq, xo + 36 + 4 * k))
                        ia, ib = vadd(ia, ja_), vadd(ib, jb)
                        ja = s * 8 + 2 * c
                        sa, ma = group_scales(sc, mn, d, dmin, g, ns, s, 2 * c)
                        sb, mb = group_scales(sc, mn, d, dmin, g, ns, s, 2 * c + 1)
                        acc = muladd(acc, to_f32(ia), vmul(sa, xd[m, ja]))
                        acc = muladd(acc, to_f32(ib), vmul(sb, xd[m, ja + 1]))
                        acc = vsub(acc, vmul(ma, xs32[m, ja]))
                        acc = vsub(acc, vmul(mb, xs32[m, ja + 1]))
                store_rows(out, m, 8 * g, acc)
            continue
        # 4 activation rows per pass, the last pass moved back to end at M (inline: see k_bytes.gemv_q8_0)
        for m in range(0, M, 4):
            m0 = min(m, M - 4)
            a0, a1, a2, a3 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
            for s in range(ns):
                for c in range(4):
                    o = (g * ns + s) * 1024 + 256 * c
                    if m == 0:
                        prefetch_chunk(qs, sc, mn, d, dmin, o, (g * ns + s) * 64 + c * 16)
                    xo = m0 * K + s * 256 + 64 * c
                    i0, i1, i2, i3 = zero_i32x8(), zero_i32x8(), zero_i32x8(), zero_i32x8()
                    h0, h1, h2, h3 = zero_i32x8(), zero_i32x8(), zero_i32x8(), zero_i32x8()
                    for k in range(8):
                        w = load_u8x32(qs, o + 32 * k)
                        lo, hi = vand(w, 15), vshr(w, 4)
                        i0 = dpbusd(i0, lo, load_bcast4(xq, xo + 4 * k))
                        i1 = dpbusd(i1, lo, load_bcast4(xq, xo + K + 4 * k))
                        i2 = dpbusd(i2, lo, load_bcast4(xq, xo + 2 * K + 4 * k))
                        i3 = dpbusd(i3, lo, load_bcast4(xq, xo + 3 * K + 4 * k))
                        h0 = dpbusd(h0, hi, load_bcast4(xq, xo + 32 + 4 * k))
                        h1 = dpbusd(h1, hi, load_bcast4(xq, xo + K + 32 + 4 * k))
                        h2 = dpbusd(h2, hi, load_bcast4(xq, xo + 2 * K + 32 + 4 * k))
                        h3 = dpbusd(h3, hi, load_bcast4(xq, xo + 3 * K + 32 + 4 * k))
                    ja = s * 8 + 2 * c
                    sa, ma = group_scales(sc, mn, d, dmin, g, ns, s, 2 * c)
                    sb, mb = group_scales(sc, mn, d, dmin, g, ns, s, 2 * c + 1)
                    a0 = muladd(a0, to_f32(i0), vmul(sa, xd[m0, ja]))
                    a0 = muladd(a0, to_f32(h0), vmul(sb, xd[m0, ja + 1]))
                    a0 = vsub(vsub(a0, vmul(ma, xs32[m0, ja])), vmul(mb, xs32[m0, ja + 1]))
                    a1 = muladd(a1, to_f32(i1), vmul(sa, xd[m0 + 1, ja]))
                    a1 = muladd(a1, to_f32(h1), vmul(sb, xd[m0 + 1, ja + 1]))
                    a1 = vsub(vsub(a1, vmul(ma, xs32[m0 + 1, ja])), vmul(mb, xs32[m0 + 1, ja + 1]))
                    a2 = muladd(a2, to_f32(i2), vmul(sa, xd[m0 + 2, ja]))
                    a2 = muladd(a2, to_f32(h2), vmul(sb, xd[m0 + 2, ja + 1]))
                    a2 = vsub(vsub(a2, vmul(ma, xs32[m0 + 2, ja])), vmul(mb, xs32[m0 + 2, ja + 1]))
                    a3 = muladd(a3, to_f32(i3), vmul(sa, xd[m0 + 3, ja]))
                    a3 = muladd(a3, to_f32(h3), vmul(sb, xd[m0 + 3, ja + 1]))
                    a3 = vsub(vsub(a3, vmul(ma, xs32[m0 + 3, ja])), vmul(mb, xs32[m0 + 3, ja + 1]))
            store_rows(out, m0, 8 * g, a0)
            store_rows(out, m0 + 1, 8 * g, a1)
            store_rows(out, m0 + 2, 8 * g, a2)
            store_rows(out, m0 + 3, 8 * g, a3)


@njit(parallel=True, cache=CACHE)
def deq_q4_k(qs, sc, mn, d, dmin, rows, out):
    K = out.shape[1]
    ns = K // 256
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        for s in range(ns):
            dd = f16_to_f32(d[g, 8 * s + r])
            dm = f16_to_f32(dmin[g, 8 * s + r])
            for c in range(4):
                v = load_strided4(qs, (g * ns + s) * 1024 + 256 * c + 4 * r, 32)  # GGUF's 32 bytes of the chunk
                for half in range(2):
                    j = 2 * c + half
                    dl = dd * np.float32(sc[g, 64 * s + 8 * j + r])
                    ml = dm * np.float32(mn[g, 64 * s + 8 * j + r])
                    q = u8_to_f32(vshr(v, 4) if half else vand(v, 15))
                    store(out, t * K + s * 256 + j * 32, vsub(vmul(q, dl), ml))
