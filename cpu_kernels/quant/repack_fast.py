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
    return np.empty((G, nb * 256), np.uint8), np.empty((G, nb * 8), np.uint16)


def q8_0(raw):
    """raw uint8 (N, nb * 34) -> q uint8 (G, nb * 256), d uint16 (G, nb * 8): k_bytes' 8-row interleaved layout,
    values + 128 (Q8_0 stores them signed)."""
    q, d = outputs(raw.shape[0], raw.shape[1] // 34)
    _q8_0(raw, q, d)
    return q, d


def q5_0(raw):
    """raw uint8 (N, nb * 22) -> q uint8 (G, nb * 256), d uint16 (G, nb * 8) as q8_0: the 5-bit values q in
    0..31 stand for q - 16, stored as q + 112."""
    q, d = outputs(raw.shape[0], raw.shape[1] // 22)
    _q5_0(raw, q, d)
    return q, d


@njit(parallel=True, cache=CACHE)
def _q8_0(raw, q, d):
    N = raw.shape[0]
    nb = raw.shape[1] // 34
    G = q.shape[0]
    q[G - 1] = 128  # rows past N: zero values, zero scales
    d[G - 1] = 0
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for b in range(nb):
                o = b * 34
                d[g, 8 * b + r] = np.uint16(raw[n, o]) | (np.uint16(raw[n, o + 1]) << np.uint16(8))
                for e in range(32):
                    q[g, 256 * b + 32 * (e >> 2) + 4 * r + (e & 3)] = raw[n, o + 2 + e] ^ np.uint8(0x80)


@njit(parallel=True, cache=CACHE)
def _q5_0(raw, q, d):
    N = raw.shape[0]
    nb = raw.shape[1] // 22
    G = q.shape[0]
    q[G - 1] = 128
    d[G - 1] = 0
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for b in range(nb):
                o = b * 22
                d[g, 8 * b + r] = np.uint16(raw[n, o]) | (np.uint16(raw[n, o + 1]) << np.uint16(8))
                qh = np.uint32(0)
                for j in range(4):
                    qh |= np.uint32(raw[n, o + 2 + j]) << np.uint32(8 * j)
                for e in range(32):
                    byte = np.uint32(raw[n, o + 6 + (e & 15)])
                    v = (byte & np.uint32(15)) if e < 16 else (byte >> np.uint32(4))
                    v |= ((qh >> np.uint32(e)) & np.uint32(1)) << np.uint32(4)
                    q[g, 256 * b + 32 * (e >> 2) + 4 * r + (e & 3)] = np.uint8(v + np.uint32(112))
