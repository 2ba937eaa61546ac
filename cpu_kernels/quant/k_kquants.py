"""Kernels for the 256-element super-block format Q5_K, and the Q6_K value decoder (Q4_K and Q6_K kernels:
k_kquants_x8.py).

Same contracts as k_legacy.py: gemv_*(packed..., x f32 (M, K), out f32 (M, N)) with Q8 activations,
deq_*(packed..., rows int64 (T,), out (T, K)) bit-equal to gguf's numpy dequantize (f32 out) or
rounded to bfloat16 bits (uint16 out). Layouts: see repack.py.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .q8act import quantize_act
from .dot import dpbusd7
from .simd import (CACHE, bcast, hsum, load_f32x8, load_u8x32, load_u8x8, muladd, store, to_f32, u8_to_f32, vand, vmul,
                   vor, vshl, vshr, vsub, zero_f32x8, zero_i32x8)


# Q5_K ------------------------------------------------------------------------------------
# Per 64 elements (chunk c of a super-block) 32 bytes of qs: low nibbles = group 2c, high = 2c + 1.
# Q5_K's 5th bits: bit j of the super-block's 32 qh bytes belongs to group j.
@njit(cache=CACHE)
def q5k_group(v, hv, j, high):
    """u8x32 of group j's 5-bit values from its qs bytes v (nibble high) and the qh bytes hv."""
    lo = vshr(v, 4) if high else vand(v, 15)
    return vor(lo, vshl(vand(vshr(hv, j), 1), 4))


@njit(parallel=True, cache=CACHE)
def gemv_q5_k(qs, qh, sc, mn, d, dmin, x, out):
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    N, ns = d.shape
    nb = K // 32
    for n in prange(N):
        for m in range(M):
            acc = zero_f32x8()
            macc = zero_f32x8()
            for s in range(ns):
                scv = vmul(vmul(u8_to_f32(load_u8x8(sc, n * nb + s * 8)), load_f32x8(xd, m * nb + s * 8)),
                           d[n, s])
                mnv = vmul(u8_to_f32(load_u8x8(mn, n * nb + s * 8)), load_f32x8(xs32, m * nb + s * 8))
                macc = muladd(macc, mnv, dmin[n, s])
                hv = load_u8x32(qh, n * (K // 8) + s * 32)
                for c in range(4):
                    v = load_u8x32(qs, n * (K // 2) + s * 128 + c * 32)
                    xo = m * K + s * 256 + c * 64
                    i0 = dpbusd7(zero_i32x8(), q5k_group(v, hv, 2 * c, False), load_u8x32(xq, xo))
                    i1 = dpbusd7(zero_i32x8(), q5k_group(v, hv, 2 * c + 1, True), load_u8x32(xq, xo + 32))
                    acc = muladd(acc, to_f32(i0), bcast(scv, 2 * c))
                    acc = muladd(acc, to_f32(i1), bcast(scv, 2 * c + 1))
            out[m, n] = hsum(vsub(acc, macc))


@njit(parallel=True, cache=CACHE)
def deq_q5_k(qs, qh, sc, mn, d, dmin, rows, out):
    N, ns = d.shape
    K = ns * 256
    for t in prange(rows.shape[0]):
        n = rows[t]
        for s in range(ns):
            hv = load_u8x32(qh, n * (K // 8) + s * 32)
            for c in range(4):
                v = load_u8x32(qs, n * (K // 2) + s * 128 + c * 32)
                for half in range(2):
                    j = s * 8 + 2 * c + half
                    dl = d[n, s] * np.float32(sc[n, j])
                    ml = dmin[n, s] * np.float32(mn[n, j])
                    q = u8_to_f32(q5k_group(v, hv, 2 * c + half, half == 1))
                    store(out, t * K + j * 32, vsub(vmul(q, dl), ml))


# Q6_K -------------------------------------------------------------------------------------------
# Per 128 elements (half h of a super-block): ql bytes A = 0..31, B = 32..63 and qh bytes 0..31 give
# group 0 = A & 15 | (qh & 3) << 4, group 1 = B & 15 | (qh >> 2 & 3) << 4,
# group 2 = A >> 4 | (qh >> 4 & 3) << 4, group 3 = B >> 4 | (qh >> 6) << 4; value = q - 32.
@njit(cache=CACHE)
def q6k_group(qa, qb, hv, k):
    lo = (vshr(qb, 4) if k == 3 else vshr(qa, 4)) if k >= 2 else (vand(qb, 15) if k == 1 else vand(qa, 15))
    return vor(lo, vshl(vand(vshr(hv, 2 * k), 3), 4))
