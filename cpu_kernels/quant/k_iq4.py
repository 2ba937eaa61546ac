"""Kernels for IQ4_NL and IQ4_XS (llama.cpp's non-linear 4-bit formats) with rows interleaved 8 by 8, as packed as
the file.

Both formats hold 4-bit codes into KVALUES (16 int8 levels, -127..113) per 32 values, in Q4_0's nibble order (low
nibble of byte j: element j, high nibble: element j + 16). IQ4_NL: an fp16 d per 32 values (Q4_0's 18-byte block,
so repack.q4_0's layout). IQ4_XS: per 256 values an fp16 d and eight 6-bit sub-scales ls; the 32-block's scale
is d * (ls - 32), exact in float32 (gguf's dl).

Layout (repack.iq4_nl / iq4_xs): qs uint8 (G, nb * 128) as Q5_0's qs (k_bytes.py); IQ4_NL d uint16 (G, nb * 8)
fp16 bits at 8 b + r; IQ4_XS sc uint8 (G, nb * 8) ls at 8 b + r and d uint16 (G, nb / 8 * 8) fp16 bits at 8 s + r.
Rows past N are zero (code 0 times a zero scale). The codes become bytes KVALUES + 128 by a 16-entry table lookup
(k_mxfp4.code_table), so the integer dots are Q8_0's (dot.dpbusd_q8: vpdpbusd with VNNI, the signed dot on AVX2,
each block starting at -Q8_OFFSET times the activations' sum), and two-group passes use the exact 512-bit dot as
Q8_0's do. Every path gives the same integers and float steps, so the same bits.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .dot import Q8_OFFSET, dpbusd_q8
from .k_bytes import block_offsets, store_rows, store_rows4
from .k_mxfp4 import code_table
from .q8act import quantize_act
from .simd import (CACHE, PREFETCH_AHEAD, concat, f16_to_f32, i8_to_f32, load_f16x8, load_u8x8, load_u8x32, muladd,
                   prefetch, store, to_f32, vadd, vand, vmul, vshr, vsub, zero_f32x8)
from .simd_lanes import load_bcast4, load_strided4x4, splat_i32
from .wide import byte_pair_passes, pair_units, unit_group

KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # ggml's kvalues_iq4nl
code_bytes = code_table([v + 128 for v in KVALUES])  # u8x32 of codes -> KVALUES[code] + 128
NO_SUBSCALES = np.zeros((1, 1), np.uint8)  # IQ4_NL's sc argument (unused)


@njit(cache=CACHE)
def iq4_quads(qs, g, nb, b, k):
    """u8x32 of level bytes (8 rows x 4) of quads k and k + 4 of block b (k = 0..3): elements 4 k.. and 16 + 4 k.."""
    v = load_u8x32(qs, (g * nb + b) * 128 + 32 * k)
    return code_bytes(vand(v, 15)), code_bytes(vshr(v, 4))


@njit(cache=CACHE)
def block_scales(sc, d, g, nb, b, xs):
    """f32x8: the 8 rows' scales of block b (IQ4_XS when xs: the super-block's d times ls - 32)."""
    if xs:
        return vmul(load_f16x8(d, (g * (nb >> 3) + (b >> 3)) * 8),
                    i8_to_f32(vsub(load_u8x8(sc, (g * nb + b) * 8), 32)))
    return load_f16x8(d, (g * nb + b) * 8)


@njit(cache=CACHE)
def prefetch_iq4(qs, g, nb, b):
    prefetch(qs, (g * nb + b) * 128 + PREFETCH_AHEAD)
    prefetch(qs, (g * nb + b) * 128 + PREFETCH_AHEAD + 64)


@njit(cache=CACHE)
def unpack_group(qs, g, nb, w8, stride, off):
    """Group g's level bytes into w8: quads k and k + 4 of block b at b * stride + (stride / 8) k (+ off) and
    stride / 2 further (k_mxfp4.unpack_group's placement)."""
    half = stride // 2
    for b in range(nb):
        prefetch_iq4(qs, g, nb, b)
        for k in range(4):
            lo, hi = iq4_quads(qs, g, nb, b, k)
            store(w8, b * stride + (stride // 8) * k + off, lo)
            store(w8, b * stride + half + (stride // 8) * k + off, hi)


@njit(cache=CACHE)
def iq4_pair(qs, sc, d, xq, xd, s, out, g, nb, xs):
    """The 4-row passes over groups g and g + 1 at once (wide.py): both groups' level bytes side by side, one exact
    512-bit dot per quad of 16 rows (PAIR hosts, where Q8_OFFSET is 128)."""
    w8, dw = np.empty(nb * 512, np.uint8), np.empty(nb * 16, np.float32)
    unpack_group(qs, g, nb, w8, 512, 0)
    unpack_group(qs, g + 1, nb, w8, 512, 32)
    for b in range(nb):
        store(dw, 16 * b, concat(block_scales(sc, d, g, nb, b, xs), block_scales(sc, d, g + 1, nb, b, xs)))
    byte_pair_passes(w8, dw, xq, xd, s, out, g, nb)


@njit(cache=CACHE)
def gemv_iq4_nl(qs, d, x, out):
    """out (M, N) = x (M, K) @ W^T for W in repack.iq4_nl's layout, with Q8 activations."""
    iq4_passes(qs, NO_SUBSCALES, d, x, out, False)


@njit(cache=CACHE)
def gemv_iq4_xs(qs, sc, d, x, out):
    """out (M, N) = x (M, K) @ W^T for W in repack.iq4_xs's layout, with Q8 activations."""
    iq4_passes(qs, sc, d, x, out, True)


@njit(parallel=True, cache=CACHE)
def iq4_passes(qs, sc, d, x, out, xs):
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    G = qs.shape[0]
    nb = K // 32
    s = block_offsets(xn4, nb, Q8_OFFSET)
    P = pair_units(M, out.shape[1])
    for u in prange(G - P):
        g = unit_group(u, P)
        if g < 2 * P:
            iq4_pair(qs, sc, d, xq, xd, s, out, g, nb, xs)
            continue
        if M < 4:
            for m in range(M):
                acc = zero_f32x8()
                for b in range(nb):
                    if m == 0:
                        prefetch_iq4(qs, g, nb, b)
                    xo = m * K + b * 32
                    a, c = splat_i32(s[m, b]), splat_i32(0)  # two chains: vpdpbusd's latency
                    for k in range(4):
                        lo, hi = iq4_quads(qs, g, nb, b, k)
                        a = dpbusd_q8(a, lo, load_bcast4(xq, xo + 4 * k))
                        c = dpbusd_q8(c, hi, load_bcast4(xq, xo + 16 + 4 * k))
                    acc = muladd(acc, to_f32(vadd(a, c)), vmul(block_scales(sc, d, g, nb, b, xs), xd[m, b]))
                store_rows(out, m, 8 * g, acc)
            continue
        # The group's level bytes unpacked once, then read by every 4-row pass (as gemv_q5_0).
        w8 = np.empty(nb * 256, np.uint8)
        unpack_group(qs, g, nb, w8, 256, 0)
        for m in range(0, M, 4):  # as gemv_q8_0: the last pass moved back to end at M
            m0 = min(m, M - 4)
            a0, a1, a2, a3 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
            for b in range(nb):
                i0, i1 = splat_i32(s[m0, b]), splat_i32(s[m0 + 1, b])
                i2, i3 = splat_i32(s[m0 + 2, b]), splat_i32(s[m0 + 3, b])
                x0 = m0 * K + b * 32
                for k in range(4):
                    lo, hi = load_u8x32(w8, b * 256 + 32 * k), load_u8x32(w8, b * 256 + 32 * k + 128)
                    i0 = dpbusd_q8(dpbusd_q8(i0, lo, load_bcast4(xq, x0 + 4 * k)), hi, load_bcast4(xq, x0 + 16 + 4 * k))
                    i1 = dpbusd_q8(dpbusd_q8(i1, lo, load_bcast4(xq, x0 + K + 4 * k)), hi,
                                   load_bcast4(xq, x0 + K + 16 + 4 * k))
                    i2 = dpbusd_q8(dpbusd_q8(i2, lo, load_bcast4(xq, x0 + 2 * K + 4 * k)), hi,
                                   load_bcast4(xq, x0 + 2 * K + 16 + 4 * k))
                    i3 = dpbusd_q8(dpbusd_q8(i3, lo, load_bcast4(xq, x0 + 3 * K + 4 * k)), hi,
                                   load_bcast4(xq, x0 + 3 * K + 16 + 4 * k))
                dw = block_scales(sc, d, g, nb, b, xs)
                a0 = muladd(a0, to_f32(i0), vmul(dw, xd[m0, b]))
                a1 = muladd(a1, to_f32(i1), vmul(dw, xd[m0 + 1, b]))
                a2 = muladd(a2, to_f32(i2), vmul(dw, xd[m0 + 2, b]))
                a3 = muladd(a3, to_f32(i3), vmul(dw, xd[m0 + 3, b]))
            store_rows4(out, m0, 8 * g, a0, a1, a2, a3)


@njit(cache=CACHE)
def deq_iq4_nl(qs, d, rows, out):
    iq4_deq(qs, NO_SUBSCALES, d, rows, out, False)


@njit(cache=CACHE)
def deq_iq4_xs(qs, sc, d, rows, out):
    iq4_deq(qs, sc, d, rows, out, True)


@njit(parallel=True, cache=CACHE)
def iq4_deq(qs, sc, d, rows, out, xs):
    """out[t] = W[rows[t]] (float32, or bf16 bits into uint16), gguf's values: (d or d * (ls - 32)) * level."""
    K = out.shape[1]
    nb = K // 32
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        for b in range(nb):
            if xs:
                dl = f16_to_f32(d[g, 8 * (b >> 3) + r]) * np.float32(np.int32(sc[g, 8 * b + r]) - 32)
            else:
                dl = f16_to_f32(d[g, 8 * b + r])
            v = load_strided4x4(qs, (g * nb + b) * 128 + 4 * r, 32)  # GGUF's 16 qs bytes of the row
            q = code_bytes(concat(vand(v, 15), vshr(v, 4)))
            store(out, t * K + b * 32, vmul(i8_to_f32(vsub(q, 128)), dl))
