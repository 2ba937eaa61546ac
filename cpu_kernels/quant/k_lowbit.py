"""Kernels for the 2- and 3-bit super-block formats Q2_K and Q3_K (16-element sub-blocks).

Same contracts as k_legacy.py. Per 128 elements (half h of a super-block) the 32 bytes of qs hold
group k (of 32 elements) in bits 2k..2k+1; Q3_K's hmask bit j of its 32 bytes is group j's high bit.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .q8act import quantize_act
from .dot import dpbusd
from .simd import (CACHE, hsum, i8_to_f32, load_f32x16, load_i32x8, load_u8x16, load_u8x32, load_u8x8, muladd, store,
                   to_f32, u8_to_f32, vand, vmul, vor, vshl, vshr, vsub, zero_f32x16, zero_f32x8, zero_i32x8)
from .simd_lanes import lanes2, load_dup2, pair16


@njit(cache=CACHE)
def q3k_group(qv, hm, h, k):
    """u8x32 of group 4h + k: its 2 low bits plus 4 * its hmask bit (value = this - 4)."""
    return vor(vand(vshr(qv, 2 * k), 3), vshl(vand(vshr(hm, 4 * h + k), 1), 2))


@njit(parallel=True, cache=CACHE)
def gemv_q2_k(qs, sc, d, dmin, x, out):
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    N, ns = d.shape
    nb = K // 32
    for n in prange(N):
        for m in range(M):
            acc = zero_f32x8()
            macc = zero_f32x16()
            for s in range(ns):
                # mins: dmin * m_j * (xd * sum of the 16 activations of sub-block j)
                mv = u8_to_f32(vshr(load_u8x16(sc, n * (K // 16) + s * 16), 4))
                macc = muladd(macc, vmul(mv, load_f32x16(xs16, m * (K // 16) + s * 16)), dmin[n, s])
                for h in range(2):
                    qv = load_u8x32(qs, n * (K // 4) + s * 64 + h * 32)
                    e = s * 256 + h * 128
                    scl = vmul(vmul(u8_to_f32(vand(load_u8x8(sc, n * (K // 16) + e // 16), 15)),
                                    load_dup2(xd, m * nb + e // 32)), d[n, s])
                    for k in range(4):
                        iv = dpbusd(zero_i32x8(), vand(vshr(qv, 2 * k), 3), load_u8x32(xq, m * K + e + 32 * k))
                        acc = muladd(acc, to_f32(iv), lanes2(scl, k))
            out[m, n] = hsum(acc) - hsum(macc)


@njit(parallel=True, cache=CACHE)
def deq_q2_k(qs, sc, d, dmin, rows, out):
    N, ns = d.shape
    K = ns * 256
    for t in prange(rows.shape[0]):
        n = rows[t]
        for s in range(ns):
            for h in range(2):
                qv = load_u8x32(qs, n * (K // 4) + s * 64 + h * 32)
                for k in range(4):
                    j = s * 16 + h * 8 + 2 * k
                    a = np.int32(sc[n, j])
                    b = np.int32(sc[n, j + 1])
                    dl = pair16(d[n, s] * np.float32(a & 15), d[n, s] * np.float32(b & 15))
                    ml = pair16(dmin[n, s] * np.float32(a >> 4), dmin[n, s] * np.float32(b >> 4))
                    q = u8_to_f32(vand(vshr(qv, 2 * k), 3))
                    store(out, t * K + j * 16, vsub(vmul(q, dl), ml))


@njit(parallel=True, cache=CACHE)
def gemv_q3_k(hmask, qs, sc, d, x, out):
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    N, ns = d.shape
    nb = K // 32
    for n in prange(N):
        for m in range(M):
            acc = zero_f32x8()
            for s in range(ns):
                hm = load_u8x32(hmask, n * (K // 8) + s * 32)
                for h in range(2):
                    qv = load_u8x32(qs, n * (K // 4) + s * 64 + h * 32)
                    e = s * 256 + h * 128
                    scl = vmul(vmul(i8_to_f32(load_u8x8(sc, n * (K // 16) + e // 16)), load_dup2(xd, m * nb + e // 32)),
                               d[n, s])
                    for k in range(4):
                        init = vshl(load_i32x8(xn4, m * (K // 4) + e // 4 + 8 * k), 2)
                        iv = dpbusd(init, q3k_group(qv, hm, h, k), load_u8x32(xq, m * K + e + 32 * k))
                        acc = muladd(acc, to_f32(iv), lanes2(scl, k))
            out[m, n] = hsum(acc)


@njit(parallel=True, cache=CACHE)
def deq_q3_k(hmask, qs, sc, d, rows, out):
    N, ns = d.shape
    K = ns * 256
    for t in prange(rows.shape[0]):
        n = rows[t]
        for s in range(ns):
            hm = load_u8x32(hmask, n * (K // 8) + s * 32)
            for h in range(2):
                qv = load_u8x32(qs, n * (K // 4) + s * 64 + h * 32)
                for k in range(4):
                    j = s * 16 + h * 8 + 2 * k
                    scale = pair16(d[n, s] * np.float32(sc[n, j]), d[n, s] * np.float32(sc[n, j + 1]))
                    q = i8_to_f32(vsub(q3k_group(qv, hm, h, k), 4))
                    store(out, t * K + j * 16, vmul(q, scale))
