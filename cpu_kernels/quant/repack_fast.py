"""Numba twins of the numpy repackers for the formats that hold most bytes (gemma-3-270m: 180 MB of Q8_0, 44 MB
of Q5_0): numpy took 0.4-0.8 s of every load on them (a uint32 temporary per value for Q5_0's fifth bits); one
parallel pass over the row groups takes tens of ms. Outputs equal repack.q8_0_numpy / q5_0_numpy (tested)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .simd import CACHE


@njit(parallel=True, cache=CACHE)
def q8_0(raw):
    """raw uint8 (N, nb * 34) -> q uint8 (G, nb * 256), d uint16 (G, nb * 8): k_bytes' 8-row interleaved layout,
    values + 128 (Q8_0 stores them signed)."""
    N = raw.shape[0]
    nb = raw.shape[1] // 34
    G = (N + 7) // 8
    q = np.full((G, nb * 256), 128, np.uint8)
    d = np.zeros((G, nb * 8), np.uint16)
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for b in range(nb):
                o = b * 34
                d[g, 8 * b + r] = np.uint16(raw[n, o]) | (np.uint16(raw[n, o + 1]) << np.uint16(8))
                for e in range(32):
                    q[g, 256 * b + 32 * (e >> 2) + 4 * r + (e & 3)] = raw[n, o + 2 + e] ^ np.uint8(0x80)
    return q, d


@njit(parallel=True, cache=CACHE)
def q5_0(raw):
    """raw uint8 (N, nb * 22) -> q uint8 (G, nb * 256), d uint16 (G, nb * 8) as q8_0: the 5-bit values q in
    0..31 stand for q - 16, stored as q + 112."""
    N = raw.shape[0]
    nb = raw.shape[1] // 22
    G = (N + 7) // 8
    q = np.full((G, nb * 256), 128, np.uint8)
    d = np.zeros((G, nb * 8), np.uint16)
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
    return q, d
