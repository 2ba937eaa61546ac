"""Activations quantized to int8 per 32-block (llama.cpp's Q8 activations), once per matmul call.

The integer kernels take unsigned weight bytes times these signed bytes (VNNI's u8 x s8); the
per-block sums below remove a format's zero offset (Q8_0 stores q + 128) or apply its mins.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .simd import CACHE


# From this many rows on, quantize_act splits the rows over the threads (~0.7 us a row of 640: below, a parallel
# launch costs as much as it saves). The GEMVs call it before their own parallel loop; serial, it was 0.37 ms of
# a 512 x 640 matmul's 3.4.
PAR_ROWS = 32


@njit(cache=CACHE)
def _quantize_rows(x, m0, m1, xq, xd, xn4, xs32, xs16):
    nb = x.shape[1] // 32
    for m in range(m0, m1):
        for b in range(nb):
            o = b * 32
            amax = np.float32(0.0)
            for i in range(32):
                a = abs(x[m, o + i])
                if a > amax:
                    amax = a
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
            xd[m, b] = d
            s_lo = 0
            s_hi = 0
            for i4 in range(8):
                s4 = 0
                for i in range(o + 4 * i4, o + 4 * i4 + 4):
                    q = np.int32(np.rint(x[m, i] * inv))
                    xq[m, i] = np.uint8(q & 0xFF)
                    s4 += q
                xn4[m, 8 * b + i4] = -s4
                if i4 < 4:
                    s_lo += s4
                else:
                    s_hi += s4
            xs16[m, 2 * b] = d * np.float32(s_lo)
            xs16[m, 2 * b + 1] = d * np.float32(s_hi)
            xs32[m, b] = d * np.float32(s_lo + s_hi)


@njit(parallel=True, cache=CACHE)
def quantize_act(x):
    """x f32 (M, K), K % 32 == 0 -> (xq, xd, xn4, xs32, xs16):
    xq uint8 (M, K): int8 bits of round(x / xd); xd f32 (M, K/32): per-block scale amax / 127;
    xn4 int32 (M, K/4): minus the sum of each 4 consecutive int8 values (VNNI lane offsets);
    xs32 f32 (M, K/32) and xs16 f32 (M, K/16): xd times the sum of the int8 values of each 32 / 16.
    Each row's values do not depend on M or on how the rows are split."""
    M, K = x.shape
    nb = K // 32
    xq = np.empty((M, K), np.uint8)
    xd = np.empty((M, nb), np.float32)
    xn4 = np.empty((M, K // 4), np.int32)
    xs32 = np.empty((M, nb), np.float32)
    xs16 = np.empty((M, K // 16), np.float32)
    if M >= PAR_ROWS:
        nc = min(M, 64)
        for c in prange(nc):
            _quantize_rows(x, c * M // nc, (c + 1) * M // nc, xq, xd, xn4, xs32, xs16)
    else:
        _quantize_rows(x, 0, M, xq, xd, xn4, xs32, xs16)
    return xq, xd, xn4, xs32, xs16


def quantize_act_ref(x: np.ndarray):
    """numpy twin of quantize_act, for tests."""
    M, K = x.shape
    xb = x.reshape(M, K // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(-1)
    xd = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int32)
    xn4 = -q.reshape(M, K // 4, 4).sum(-1).astype(np.int32)
    s16 = q.reshape(M, K // 16, 16).sum(-1).astype(np.float32)
    xs16 = (np.repeat(xd, 2, axis=1) * s16).astype(np.float32)
    xs32 = (xd * q.sum(-1).astype(np.float32)).astype(np.float32)
    return q.astype(np.int8).view(np.uint8).reshape(M, K), xd, xn4, xs32, xs16
