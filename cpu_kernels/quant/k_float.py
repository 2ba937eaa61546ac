"""Kernels for unquantized weights: F32, F16 and BF16 (the last two stored as uint16 bits).

gemv_*(w (N, K), x f32 (M, K), out f32 (M, N)): x @ W^T in float32, 16 lanes then a fixed pairwise
lane sum, then the K % 16 tail in order; every (m, n) is reduced the same way whatever M is.
deq_*(w, rows int64 (T,), out (T, K)): exact widening into float32 out (numpy); a uint16 out receives
bfloat16 bits rounded to nearest even (for a bf16 matmul; QuantLinear does not use it now).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .bf16_io import rows_to_bf16
from .simd import (CACHE, bf16_to_f32, f16_to_f32, hsum, load_bf16x16, load_f16x16, load_f32x16, muladd, vadd,
                   zero_f32x16)


@njit(parallel=True, cache=CACHE)
def gemv_f32(w, x, out):
    M, K = x.shape
    N = w.shape[0]
    K16 = K - K % 16
    for n in prange(N):
        for m in range(M):
            acc = zero_f32x16()
            for k in range(0, K16, 16):
                acc = muladd(acc, load_f32x16(w, n * K + k), load_f32x16(x, m * K + k))
            s = hsum(acc)
            for k in range(K16, K):
                s += w[n, k] * x[m, k]
            out[m, n] = s


@njit(parallel=True, cache=CACHE)
def gemv_f16(w, x, out):
    M, K = x.shape
    N = w.shape[0]
    K16 = K - K % 16
    for n in prange(N):
        for m in range(M):
            acc = zero_f32x16()
            for k in range(0, K16, 16):
                acc = muladd(acc, load_f16x16(w, n * K + k), load_f32x16(x, m * K + k))
            s = hsum(acc)
            for k in range(K16, K):
                s += f16_to_f32(w[n, k]) * x[m, k]
            out[m, n] = s


@njit(parallel=True, cache=CACHE)
def gemv_bf16(w, x, out):
    M, K = x.shape
    N = w.shape[0]
    K16, K32 = K - K % 16, K - K % 32
    for n in prange(N):
        for m in range(M):
            acc, acc2 = zero_f32x16(), zero_f32x16()
            for k in range(0, K32, 32):  # two chains: one FMA's latency per 32 bytes kept a core below DRAM's rate
                acc = muladd(acc, load_bf16x16(w, n * K + k), load_f32x16(x, m * K + k))
                acc2 = muladd(acc2, load_bf16x16(w, n * K + k + 16), load_f32x16(x, m * K + k + 16))
            if K32 < K16:
                acc = muladd(acc, load_bf16x16(w, n * K + K32), load_f32x16(x, m * K + K32))
            s = hsum(vadd(acc, acc2))
            for k in range(K16, K):
                s += bf16_to_f32(w[n, k]) * x[m, k]
            out[m, n] = s


def _put(vals: np.ndarray, out: np.ndarray) -> None:
    if out.dtype == np.uint16:
        b = vals.astype(np.float32, copy=False).view(np.uint32)
        out[...] = ((b + np.uint32(0x7FFF) + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    else:
        out[...] = vals


def deq_f32(w, rows, out):
    if out.dtype == np.uint16 and w.dtype == np.float32:  # a bf16 prefill's tile: every core converts (_put's rule)
        rows_to_bf16(w.view(np.uint32), rows, out)
    else:
        _put(np.take(w, rows, axis=0), out)


def deq_f16(w, rows, out):
    _put(np.take(w, rows, axis=0).view(np.float16).astype(np.float32), out)


def deq_bf16(w, rows, out):
    if out.dtype == np.uint16:
        np.take(w, rows, axis=0, out=out)
    else:
        out.view(np.uint32)[...] = np.take(w, rows, axis=0).astype(np.uint32) << 16
