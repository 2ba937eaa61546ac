"""Numba twins of the numpy repackers for the formats that hold most bytes (gemma-3-270m: 180 MB of Q8_0, 44 MB
of Q5_0): numpy took 0.4-0.8 s of every load on them (a uint32 temporary per value for Q5_0's fifth bits); one
parallel pass over the row groups takes tens of ms. Outputs equal repack.q8_0_numpy / q5_0_numpy (tested)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .simd import CACHE


def outputs(N: int, nb: int):
    """q uint8 (G, nb * 256) and d uint16 (G, nb * 8), allocated by numpy: it asks the kernel for transparent huge
    pages on large arrays (Numba's allocator does not), and the 4 KiB pages' TLB misses cost the 262144 x 640
    GEMV ~10 % from DRAM."""
    G = (N + 7) // 8
    q, d = np.empty((G, nb * 256), np.uint8), np.empty((G, nb * 8), np.uint16)
    q[-1], d[-1] = 128, 0  # rows past N: zero values, zero scales (the kernels fill the rest)
    return q, d


def q8_0(raw):
    """raw uint8 (N, nb * 34) -> q uint8 (G, nb * 256), d uint16 (G, nb * 8): k_bytes' 8-row interleaved layout,
    values + 128 (Q8_0 stores them signed)."""
    q, d = outputs(raw.shape[0], raw.shape[1] // 34)
    _q8_0(raw, q, d)
    return q, d


def q5_0(raw):
    """raw uint8 (N, nb * 22) -> qs uint8 (G, nb * 128), qh uint32 (G, nb * 8), d uint16 (G, nb * 8): k_bytes' Q5_0
    layout, numpy-allocated."""
    N, nb = raw.shape[0], raw.shape[1] // 22
    G = (N + 7) // 8
    out = np.empty((G, nb * 128), np.uint8), np.zeros((G, nb * 8), np.uint32), np.empty((G, nb * 8), np.uint16)
    out[0][-1], out[2][-1] = 0, 0  # rows past N (qh is zeroed whole: the kernel ORs bits into it)
    _q5_0(raw, *out)
    return out


@njit(parallel=True, cache=CACHE)
def _q8_0(raw, q, d):
    N = raw.shape[0]
    nb = raw.shape[1] // 34
    G = q.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for b in range(nb):
                o = b * 34
                d[g, 8 * b + r] = np.uint16(raw[n, o]) | (np.uint16(raw[n, o + 1]) << np.uint16(8))
                for e in range(32):
                    q[g, 256 * b + 32 * (e >> 2) + 4 * r + (e & 3)] = raw[n, o + 2 + e] ^ np.uint8(0x80)


@njit(parallel=True, cache=CACHE)
def _q5_0(raw, qs, qh, d):
    N = raw.shape[0]
    nb = raw.shape[1] // 22
    G = qs.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for b in range(nb):
                o = b * 22
                d[g, 8 * b + r] = np.uint16(raw[n, o]) | (np.uint16(raw[n, o + 1]) << np.uint16(8))
                h = np.uint32(0)
                for j in range(4):
                    h |= np.uint32(raw[n, o + 2 + j]) << np.uint32(8 * j)
                for k in range(8):
                    qh[g, 8 * b + k] |= ((h >> np.uint32(4 * k)) & np.uint32(15)) << np.uint32(4 * r)
                for e in range(16):
                    qs[g, 128 * b + 32 * (e >> 2) + 4 * r + (e & 3)] = raw[n, o + 6 + e]


def q4_k(raw):
    """raw uint8 (N, ns * 144) -> repack.q4_k_numpy's arrays (k_kquants_x8's layout), numpy-allocated."""
    N, ns = raw.shape[0], raw.shape[1] // 144
    G = (N + 7) // 8
    out = (np.empty((G, ns * 1024), np.uint8), np.empty((G, ns * 64), np.uint8), np.empty((G, ns * 64), np.uint8),
           np.empty((G, ns * 8), np.uint16), np.empty((G, ns * 8), np.uint16))
    for a in out:
        a[-1] = 0  # rows past N
    _q4_k(raw, *out)
    return out


def q6_k(raw):
    """raw uint8 (N, ns * 210) -> repack.q6_k_numpy's arrays (k_kquants_x8's layout), numpy-allocated."""
    N, ns = raw.shape[0], raw.shape[1] // 210
    G = (N + 7) // 8
    out = (np.empty((G, ns * 1024), np.uint8), np.empty((G, ns * 512), np.uint8), np.empty((G, ns * 128), np.int8),
           np.empty((G, ns * 8), np.uint16))
    for a in out:
        a[-1] = 0
    _q6_k(raw, out[0], out[1], out[2].view(np.uint8), out[3])
    return out


@njit(cache=CACHE)
def _u16(raw, n, o):
    return np.uint16(raw[n, o]) | (np.uint16(raw[n, o + 1]) << np.uint16(8))


@njit(parallel=True, cache=CACHE)
def _q4_k(raw, qs, sc, mn, d, dmin):
    N, ns, G = raw.shape[0], raw.shape[1] // 144, qs.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for s in range(ns):
                o = s * 144
                d[g, 8 * s + r] = _u16(raw, n, o)
                dmin[g, 8 * s + r] = _u16(raw, n, o + 2)
                for j in range(4):  # ggml's get_scale_min_k4
                    lo, hi, md = raw[n, o + 4 + j], raw[n, o + 8 + j], raw[n, o + 12 + j]
                    sc[g, 64 * s + 8 * j + r] = lo & np.uint8(63)
                    mn[g, 64 * s + 8 * j + r] = hi & np.uint8(63)
                    sc[g, 64 * s + 8 * (j + 4) + r] = (md & np.uint8(15)) | ((lo >> np.uint8(2)) & np.uint8(0x30))
                    mn[g, 64 * s + 8 * (j + 4) + r] = (md >> np.uint8(4)) | ((hi >> np.uint8(2)) & np.uint8(0x30))
                for c in range(4):
                    for i in range(32):
                        qs[g, 1024 * s + 256 * c + 32 * (i >> 2) + 4 * r + (i & 3)] = raw[n, o + 16 + 32 * c + i]


@njit(parallel=True, cache=CACHE)
def _q6_k(raw, ql, qh, sc, d):
    N, ns, G = raw.shape[0], raw.shape[1] // 210, ql.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for s in range(ns):
                o = s * 210
                for bi in range(128):  # ql byte 64 h + 32 p + 4 k + i
                    h, p, k, i = bi >> 6, (bi >> 5) & 1, (bi >> 2) & 7, bi & 3
                    ql[g, 512 * (2 * s + h) + 64 * k + 32 * p + 4 * r + i] = raw[n, o + bi]
                for bi in range(64):  # qh byte 32 h + 4 k + i
                    h, k, i = bi >> 5, (bi >> 2) & 7, bi & 3
                    qh[g, 256 * (2 * s + h) + 32 * k + 4 * r + i] = raw[n, o + 128 + bi]
                for j in range(16):
                    sc[g, 128 * s + 8 * j + r] = raw[n, o + 192 + j]
                d[g, 8 * s + r] = _u16(raw, n, o + 208)
