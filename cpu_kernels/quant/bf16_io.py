"""The bf16 prefill GEMM's input and output conversions on every core: float32 rows -> bfloat16 bits (round to
nearest even, torch's rule) and a bf16 product written into its float32 block of the result, plus a bias (the exact
widening, then the add: the bits of torch's copy_ and numpy's add, one pass instead of two)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .simd import CACHE

_NO_BIAS = np.empty(0, np.float32)


@njit(cache=CACHE, inline="always")
def bf16_round(b):
    """float32 bits (uint32) -> the bfloat16 bits nearest (ties to even; finite values)."""
    return np.uint16((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@njit(parallel=True, cache=CACHE)
def rows_to_bf16(bits, rows, out):
    """out[i] = the bfloat16 bits of float32 bits row rows[i], rounded to nearest even (finite values), a row per
    thread step: activations before a bf16 GEMM, F32 weight tiles."""
    for i in prange(rows.shape[0]):
        src, dst = bits[rows[i]], out[i]
        for k in range(src.shape[0]):
            dst[k] = bf16_round(src[k])


def to_bf16(x: np.ndarray) -> np.ndarray:
    """x f32 (M, K) C-contiguous -> new uint16 (M, K): its bfloat16 bits, rounded to nearest even (finite values)."""
    out = np.empty(x.shape, np.uint16)
    rows_to_bf16(x.view(np.uint32), np.arange(x.shape[0], dtype=np.int64), out)
    return out


@njit(parallel=True, cache=CACHE)
def _from_bf16(bits, y, ybits, r0, c0, bias):
    n = bits.shape[1]
    for t in prange(bits.shape[0]):
        src, dst, dbits = bits[t], y[r0 + t, c0:c0 + n], ybits[r0 + t, c0:c0 + n]
        for j in range(n):
            dbits[j] = np.uint32(src[j]) << np.uint32(16)
        if bias.shape[0]:
            b = bias[c0:c0 + n]
            for j in range(n):
                dst[j] += b[j]


def from_bf16(bits: np.ndarray, y: np.ndarray, r0: int, c0: int, bias: np.ndarray | None = None) -> None:
    """y[r0:r0 + m, c0:c0 + n] = float32(bits) (+ bias[c0:c0 + n]): bits uint16 (m, n), y f32 C-contiguous."""
    _from_bf16(bits, y, y.view(np.uint32), r0, c0, _NO_BIAS if bias is None else bias)
