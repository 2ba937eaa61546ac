"""Q4_K with rows interleaved 8 by 8 (Q6_K: k_q6_k_x8.py): k_bytes.py's scheme (one int32 lane per weight row, activation quads
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

from .k_bytes import store_rows, store_rows4
from .q8act import quantize_act
from .dot import acc_i32, dpbusd_acc, zero_acc
from .wide import (dpbusd16, five_rows, load_bcast4x16, load_u8x64, pair_units, pass_rows, rows_back,
                   splat_i32x16, store16x4, three_as_four, unit_group)
from .simd import (CACHE, PREFETCH_AHEAD_L2, concat, f16_to_f32, load_f16x8, load_f32x16, load_u8x8, load_u8x32,
                   muladd, prefetch_l2, store, to_f32, u8_to_f32, vadd, vand, vmul, vshr, vsub, zero_f32x8,
                   zero_f32x16)
from .simd_lanes import load_bcast4, load_strided4

# From this many activation rows q4_k_pair unpacks both groups' nibbles to bytes once, not in every 4-row pass (M = 512:
# ~8 % faster; at M = 8-16 the unpacked copy cost 5-10 %).
UNPACK_MIN_M = 48


@njit(cache=CACHE)
def group_scales(sc, mn, d, dmin, g, ns, s, j):
    """f32x8 per row: d * sc_j and dmin * mn_j of group j of super-block s."""
    o = (g * ns + s) * 64 + 8 * j
    return (vmul(u8_to_f32(load_u8x8(sc, o)), load_f16x8(d, (g * ns + s) * 8)),
            vmul(u8_to_f32(load_u8x8(mn, o)), load_f16x8(dmin, (g * ns + s) * 8)))


# Q4_K's hints go twice PREFETCH_AHEAD_L2 ahead: decode GEMVs from DRAM (M = 1, 4-80 MB of copies cycled, the two
# distances alternating call by call for 60-100 s, medians of the per-round ratios) ran 1.11x faster at 14336 x 4096,
# 1.07x at 4096 x 4096, 1.05x at 1024 x 4096 and 640 x 2048, 1.01x at 4096 x 14336; Q6_K's streams did not gain.
Q4K_AHEAD = 2 * PREFETCH_AHEAD_L2


@njit(cache=CACHE)
def prefetch_chunk(qs, sc, mn, d, dmin, o, so):
    """L2 read hints Q4K_AHEAD bytes past chunk o of qs, and as far ahead in the scale streams (so: the chunk's
    position in sc's units): their misses, not prefetched, held Q4_K at 23 GB/s from DRAM."""
    for line in range(4):
        prefetch_l2(qs, o + Q4K_AHEAD + 64 * line)
    prefetch_l2(sc, so + Q4K_AHEAD // 16)
    prefetch_l2(mn, so + Q4K_AHEAD // 16)
    prefetch_l2(d, so // 8 + Q4K_AHEAD // 128)
    prefetch_l2(dmin, so // 8 + Q4K_AHEAD // 128)


@njit(cache=CACHE)
def q4_k_pair(qs, sc, mn, d, dmin, xq, xd, xs32, out, g, ns, unpack, M4):
    """gemv_q4_k's 4-row passes over the first M4 activation rows (wide.pass_rows) and groups g and g + 1 at once
    (wide.py): the same integers, the same bits. The groups' scales and mins are worked out once, not in every pass
    (M = 512: 5-8 % faster); with unpack (a literal at each call, see UNPACK_MIN_M) so are the nibbles, as bytes."""
    K = xq.shape[1]
    scl = np.empty(ns * 512, np.float32)  # sub-block j of super-block s: pair_scales at 32 (8 s + j), mins 16 on
    for s in range(ns):
        for j in range(8):
            sa, ma = pair_scales(sc, mn, d, dmin, g, ns, s, j)
            store(scl, 32 * (8 * s + j), sa)
            store(scl, 32 * (8 * s + j) + 16, ma)
    w8 = np.empty(ns * 4096 if unpack else 0, np.uint8)  # both groups' nibbles as bytes: quad k of chunk c at
    for s in range(ns if unpack else 0):  # 128 (8 (4 s + c) + k), the high ones 64 on
        for c in range(4):
            o = (g * ns + s) * 1024 + 256 * c
            o2 = o + ns * 1024
            prefetch_chunk(qs, sc, mn, d, dmin, o, (g * ns + s) * 64 + c * 16)
            prefetch_chunk(qs, sc, mn, d, dmin, o2, ((g + 1) * ns + s) * 64 + c * 16)
            for k in range(8):
                w = concat(load_u8x32(qs, o + 32 * k), load_u8x32(qs, o2 + 32 * k))
                store(w8, 128 * (8 * (4 * s + c) + k), vand(w, 15))
                store(w8, 128 * (8 * (4 * s + c) + k) + 64, vshr(w, 4))
    for m in range(0, M4, 4):
        m0 = min(m, M4 - 4)
        a0, a1, a2, a3 = zero_f32x16(), zero_f32x16(), zero_f32x16(), zero_f32x16()
        for s in range(ns):
            for c in range(4):
                o = (g * ns + s) * 1024 + 256 * c
                o2 = o + ns * 1024
                if m == 0 and not unpack:
                    prefetch_chunk(qs, sc, mn, d, dmin, o, (g * ns + s) * 64 + c * 16)
                    prefetch_chunk(qs, sc, mn, d, dmin, o2, ((g + 1) * ns + s) * 64 + c * 16)
                xo = m0 * K + s * 256 + 64 * c
                z = splat_i32x16(0)
                i0, i1, i2, i3, h0, h1, h2, h3 = z, z, z, z, z, z, z, z
                for k in range(8):
                    if unpack:
                        lo = load_u8x64(w8, 128 * (8 * (4 * s + c) + k))
                        hi = load_u8x64(w8, 128 * (8 * (4 * s + c) + k) + 64)
                    else:
                        w = concat(load_u8x32(qs, o + 32 * k), load_u8x32(qs, o2 + 32 * k))
                        lo, hi = vand(w, 15), vshr(w, 4)
                    i0 = dpbusd16(i0, lo, load_bcast4x16(xq, xo + 4 * k))
                    i1 = dpbusd16(i1, lo, load_bcast4x16(xq, xo + K + 4 * k))
                    i2 = dpbusd16(i2, lo, load_bcast4x16(xq, xo + 2 * K + 4 * k))
                    i3 = dpbusd16(i3, lo, load_bcast4x16(xq, xo + 3 * K + 4 * k))
                    h0 = dpbusd16(h0, hi, load_bcast4x16(xq, xo + 32 + 4 * k))
                    h1 = dpbusd16(h1, hi, load_bcast4x16(xq, xo + K + 32 + 4 * k))
                    h2 = dpbusd16(h2, hi, load_bcast4x16(xq, xo + 2 * K + 32 + 4 * k))
                    h3 = dpbusd16(h3, hi, load_bcast4x16(xq, xo + 3 * K + 32 + 4 * k))
                ja = s * 8 + 2 * c
                sa, ma = load_f32x16(scl, 32 * ja), load_f32x16(scl, 32 * ja + 16)
                sb, mb = load_f32x16(scl, 32 * ja + 32), load_f32x16(scl, 32 * ja + 48)
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
        store16x4(out, m0, 8 * g, a0, a1, a2, a3)


@njit(cache=CACHE)
def pair_scales(sc, mn, d, dmin, g, ns, s, j):
    """group_scales of groups g and g + 1 side by side (f32x16)."""
    sa, ma = group_scales(sc, mn, d, dmin, g, ns, s, j)
    sb, mb = group_scales(sc, mn, d, dmin, g + 1, ns, s, j)
    return concat(sa, sb), concat(ma, mb)


@njit(cache=CACHE)
def q4_k_five(qs, sc, mn, d, dmin, xq, xd, xs32, out, g, ns, m0):
    """gemv_q4_k's 4-row pass with a fifth row (rows m0..m0 + 4 over group g; wide.five_rows): the same integers and
    float steps per row."""
    K = xq.shape[1]
    a0, a1, a2, a3, a4 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
    for s in range(ns):
        for c in range(4):
            o = (g * ns + s) * 1024 + 256 * c
            prefetch_chunk(qs, sc, mn, d, dmin, o, (g * ns + s) * 64 + c * 16)
            xo = m0 * K + s * 256 + 64 * c
            i0, i1, i2, i3, i4 = zero_acc(), zero_acc(), zero_acc(), zero_acc(), zero_acc()
            h0, h1, h2, h3, h4 = zero_acc(), zero_acc(), zero_acc(), zero_acc(), zero_acc()
            for k in range(8):
                w = load_u8x32(qs, o + 32 * k)
                lo, hi = vand(w, 15), vshr(w, 4)
                i0 = dpbusd_acc(i0, lo, load_bcast4(xq, xo + 4 * k))
                i1 = dpbusd_acc(i1, lo, load_bcast4(xq, xo + K + 4 * k))
                i2 = dpbusd_acc(i2, lo, load_bcast4(xq, xo + 2 * K + 4 * k))
                i3 = dpbusd_acc(i3, lo, load_bcast4(xq, xo + 3 * K + 4 * k))
                i4 = dpbusd_acc(i4, lo, load_bcast4(xq, xo + 4 * K + 4 * k))
                h0 = dpbusd_acc(h0, hi, load_bcast4(xq, xo + 32 + 4 * k))
                h1 = dpbusd_acc(h1, hi, load_bcast4(xq, xo + K + 32 + 4 * k))
                h2 = dpbusd_acc(h2, hi, load_bcast4(xq, xo + 2 * K + 32 + 4 * k))
                h3 = dpbusd_acc(h3, hi, load_bcast4(xq, xo + 3 * K + 32 + 4 * k))
                h4 = dpbusd_acc(h4, hi, load_bcast4(xq, xo + 4 * K + 32 + 4 * k))
            ja = s * 8 + 2 * c
            sa, ma = group_scales(sc, mn, d, dmin, g, ns, s, 2 * c)
            sb, mb = group_scales(sc, mn, d, dmin, g, ns, s, 2 * c + 1)
            a0 = q4_k_step(a0, i0, h0, sa, sb, ma, mb, xd, xs32, m0, ja)
            a1 = q4_k_step(a1, i1, h1, sa, sb, ma, mb, xd, xs32, m0 + 1, ja)
            a2 = q4_k_step(a2, i2, h2, sa, sb, ma, mb, xd, xs32, m0 + 2, ja)
            a3 = q4_k_step(a3, i3, h3, sa, sb, ma, mb, xd, xs32, m0 + 3, ja)
            a4 = q4_k_step(a4, i4, h4, sa, sb, ma, mb, xd, xs32, m0 + 4, ja)
    store_rows4(out, m0, 8 * g, a0, a1, a2, a3)
    store_rows(out, m0 + 4, 8 * g, a4)


@njit(cache=CACHE, inline="always")
def q4_k_step(a, i, h, sa, sb, ma, mb, xd, xs32, m, ja):
    """One row's float steps for two 32-value sub-blocks, as gemv_q4_k's passes take them."""
    a = muladd(a, to_f32(acc_i32(i)), vmul(sa, xd[m, ja]))
    a = muladd(a, to_f32(acc_i32(h)), vmul(sb, xd[m, ja + 1]))
    return vsub(vsub(a, vmul(ma, xs32[m, ja])), vmul(mb, xs32[m, ja + 1]))


@njit(parallel=True, cache=CACHE)
def gemv_q4_k(qs, sc, mn, d, dmin, x, out_):
    x, out = three_as_four(x, out_, True)
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    G = qs.shape[0]
    ns = K // 256
    P = pair_units(M, out.shape[1])
    M4 = pass_rows(M)
    five = five_rows(M)
    for u in prange(G - P):
        g = unit_group(u, P)
        if g < 2 * P:
            if M >= UNPACK_MIN_M:  # literal flags: each call compiles its own variant, no branch left inside
                q4_k_pair(qs, sc, mn, d, dmin, xq, xd, xs32, out, g, ns, True, M4)
            else:
                q4_k_pair(qs, sc, mn, d, dmin, xq, xd, xs32, out, g, ns, False, M4)
        # 4 activation rows per pass over the first M4 rows, or up to a last 5-row pass (inline: see
        # k_bytes.gemv_q8_0)
        for m in range(0, (M - 5 if five else M4) if g >= 2 * P else 0, 4):
            m0 = min(m, M4 - 4)
            a0, a1, a2, a3 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
            for s in range(ns):
                for c in range(4):
                    o = (g * ns + s) * 1024 + 256 * c
                    if m == 0:
                        prefetch_chunk(qs, sc, mn, d, dmin, o, (g * ns + s) * 64 + c * 16)
                    xo = m0 * K + s * 256 + 64 * c
                    # Short accumulators: 8 dots of 4-bit weights each (dot.ACC_TYPE).
                    i0, i1, i2, i3 = zero_acc(), zero_acc(), zero_acc(), zero_acc()
                    h0, h1, h2, h3 = zero_acc(), zero_acc(), zero_acc(), zero_acc()
                    for k in range(8):
                        w = load_u8x32(qs, o + 32 * k)
                        lo, hi = vand(w, 15), vshr(w, 4)
                        i0 = dpbusd_acc(i0, lo, load_bcast4(xq, xo + 4 * k))
                        i1 = dpbusd_acc(i1, lo, load_bcast4(xq, xo + K + 4 * k))
                        i2 = dpbusd_acc(i2, lo, load_bcast4(xq, xo + 2 * K + 4 * k))
                        i3 = dpbusd_acc(i3, lo, load_bcast4(xq, xo + 3 * K + 4 * k))
                        h0 = dpbusd_acc(h0, hi, load_bcast4(xq, xo + 32 + 4 * k))
                        h1 = dpbusd_acc(h1, hi, load_bcast4(xq, xo + K + 32 + 4 * k))
                        h2 = dpbusd_acc(h2, hi, load_bcast4(xq, xo + 2 * K + 32 + 4 * k))
                        h3 = dpbusd_acc(h3, hi, load_bcast4(xq, xo + 3 * K + 32 + 4 * k))
                    ja = s * 8 + 2 * c
                    sa, ma = group_scales(sc, mn, d, dmin, g, ns, s, 2 * c)
                    sb, mb = group_scales(sc, mn, d, dmin, g, ns, s, 2 * c + 1)
                    a0 = q4_k_step(a0, i0, h0, sa, sb, ma, mb, xd, xs32, m0, ja)
                    a1 = q4_k_step(a1, i1, h1, sa, sb, ma, mb, xd, xs32, m0 + 1, ja)
                    a2 = q4_k_step(a2, i2, h2, sa, sb, ma, mb, xd, xs32, m0 + 2, ja)
                    a3 = q4_k_step(a3, i3, h3, sa, sb, ma, mb, xd, xs32, m0 + 3, ja)
            store_rows4(out, m0, 8 * g, a0, a1, a2, a3)
        if five and g >= 2 * P:
            q4_k_five(qs, sc, mn, d, dmin, xq, xd, xs32, out, g, ns, M - 5)
        # The rows past the passes (every row below 4) one at a time over each group of the unit, whose weights the
        # passes left in cache. Inline: as a function call the decode GEMV ran 2-5 % slower.
        for g1 in range(g, g + (2 if g < 2 * P else 1)):
            for m in range(M if five and g >= 2 * P else M4, M):
                acc = zero_f32x8()
                for s in range(ns):
                    for c in range(4):
                        o = (g1 * ns + s) * 1024 + 256 * c
                        if m == 0:
                            prefetch_chunk(qs, sc, mn, d, dmin, o, (g1 * ns + s) * 64 + c * 16)
                        xo = m * K + s * 256 + 64 * c
                        ia, ib, ja_, jb = zero_acc(), zero_acc(), zero_acc(), zero_acc()
                        for k in range(0, 8, 2):  # four chains: vpdpbusd's latency
                            w = load_u8x32(qs, o + 32 * k)
                            ia = dpbusd_acc(ia, vand(w, 15), load_bcast4(xq, xo + 4 * k))
                            ib = dpbusd_acc(ib, vshr(w, 4), load_bcast4(xq, xo + 32 + 4 * k))
                            w = load_u8x32(qs, o + 32 * k + 32)
                            ja_ = dpbusd_acc(ja_, vand(w, 15), load_bcast4(xq, xo + 4 * k + 4))
                            jb = dpbusd_acc(jb, vshr(w, 4), load_bcast4(xq, xo + 36 + 4 * k))
                        ia, ib = vadd(acc_i32(ia), acc_i32(ja_)), vadd(acc_i32(ib), acc_i32(jb))
                        ja = s * 8 + 2 * c
                        sa, ma = group_scales(sc, mn, d, dmin, g1, ns, s, 2 * c)
                        sb, mb = group_scales(sc, mn, d, dmin, g1, ns, s, 2 * c + 1)
                        acc = muladd(acc, to_f32(ia), vmul(sa, xd[m, ja]))
                        acc = muladd(acc, to_f32(ib), vmul(sb, xd[m, ja + 1]))
                        acc = vsub(acc, vmul(ma, xs32[m, ja]))
                        acc = vsub(acc, vmul(mb, xs32[m, ja + 1]))
                store_rows(out, m, 8 * g1, acc)
    rows_back(out_, out)


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
