"""Numba twins of the numpy repackers for the formats that hold most bytes (gemma-3-270m: 180 MB of Q8_0, 44 MB
of Q5_0): numpy took 0.4-0.8 s of every load on them (a uint32 temporary per value for Q5_0's fifth bits); one
parallel pass over the rows takes tens of ms. Outputs equal repack.q8_0 / repack.q5_0's numpy code (tested)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .simd import CACHE


@njit(parallel=True, cache=CACHE)
def q8_0(raw):
    """raw uint8 (N, nb * 34) -> qs uint8 (N, nb * 32) = q + 128, d uint16 (N, nb) fp16 bits."""
    N = raw.shape[0]
    nb = raw.shape[1] // 34
    qs = np.empty((N, nb * 32), np.uint8)
    d = np.empty((N, nb), np.uint16)
    for n in prange(N):
        for b in range(nb):
            o = b * 34
            d[n, b] = np.uint16(raw[n, o]) | (np.uint16(raw[n, o + 1]) << np.uint16(8))
            for i in range(32):
                qs[n, b * 32 + i] = raw[n, o + 2 + i] ^ np.uint8(0x80)
    return qs, d


@njit(parallel=True, cache=CACHE)
def q5_0(raw):
    """raw uint8 (N, nb * 22) -> q uint8 (N, nb * 32) the 5-bit values in element order, d uint16 (N, nb)."""
    N = raw.shape[0]
    nb = raw.shape[1] // 22
    q = np.empty((N, nb * 32), np.uint8)
    d = np.empty((N, nb), np.uint16)
    for n in prange(N):
        for b in range(nb):
            o = b * 22
            d[n, b] = np.uint16(raw[n, o]) | (np.uint16(raw[n, o + 1]) << np.uint16(8))
            qh = np.uint32(0)
            for j in range(4):
                qh |= np.uint32(raw[n, o + 2 + j]) << np.uint32(8 * j)
            for i in range(16):
                byte = np.uint32(raw[n, o + 6 + i])
                q[n, b * 32 + i] = np.uint8((byte & np.uint32(15)) | (((qh >> np.uint32(i)) & np.uint32(1)) << np.uint32(4)))
                q[n, b * 32 + 16 + i] = np.uint8((byte >> np.uint32(4))
                                                 | (((qh >> np.uint32(i + 16)) & np.uint32(1)) << np.uint32(4)))
    return q, d
