"""Parallel quantizers for loading float weights into a quantized type (vLLM's `quantization` argument): bit-equal
to gguf's numpy Q8_0 quantizer (llama.cpp's reference) and to torch's float8 cast, at ~GB/s instead of ~100 MB/s.

q8_0_rows(w f32 (N, K)) -> GGUF Q8_0 rows; fp8_rows(w f32 (N, K)) -> RamlmType.FP8_E4M3 rows (a scale per 128
values of a row: amax / 448, values rounded to nearest even, as fp8_quant.quantize_rows).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .simd import CACHE


@njit(cache=CACHE, inline="always")
def _roundf(v):
    """gguf's np_roundf: half away from zero (exact steps)."""
    a = abs(v)
    fl = np.floor(a)
    r = fl + np.floor(2.0 * (a - fl))
    return -r if v < 0 else r


@njit(cache=CACHE, inline="always")
def _amax(w, n, lo, width):
    amax = np.float32(0.0)
    for j in range(lo, lo + width):
        amax = max(amax, abs(w[n, j]))
    return amax


@njit(parallel=True, cache=CACHE)
def _q8_0(w, out, d):
    N, K = w.shape
    for n in prange(N):
        for b in range(K // 32):
            db = _amax(w, n, 32 * b, 32) / np.float32(127.0)
            inv = np.float32(1.0) / db if db != 0 else np.float32(0.0)
            d[n, b] = db
            for j in range(32):
                out[n, 34 * b + 2 + j] = np.uint8(np.int8(_roundf(w[n, 32 * b + j] * inv)))


def q8_0_rows(w: np.ndarray) -> np.ndarray:
    """w f32 (N, K), K % 32 == 0 -> Q8_0 rows uint8 (N, K / 32 * 34), what gguf.quants.quantize gives."""
    w = np.ascontiguousarray(w, np.float32)
    N, K = w.shape
    out = np.empty((N, K // 32 * 34), np.uint8)
    d = np.empty((N, K // 32), np.float32)
    _q8_0(w, out, d)
    out.reshape(N, -1, 34)[..., :2] = d.astype(np.float16).view(np.uint8).reshape(N, -1, 2)
    return out


@njit(cache=CACHE, inline="always")
def _e4m3(v):
    """float -> float8 e4m3fn byte, round to nearest even (|v| <= 448 after scaling: finite)."""
    a = abs(float(v))
    if a < 2.0 ** -6:
        code = int(np.rint(a * 512.0))  # subnormal steps of 2^-9; 8 rounds up into the first normal code
    else:
        m, ex = math.frexp(a)  # a = m 2^ex, m in [0.5, 1)
        e = ex - 1
        q = int(np.rint((2.0 * m - 1.0) * 8.0))
        if q == 8:
            q, e = 0, e + 1
        code = min(((e + 7) << 3) | q, 0x7E)
    return np.uint8(code | 0x80) if math.copysign(1.0, v) < 0 else np.uint8(code)


@njit(parallel=True, cache=CACHE)
def _fp8(w, q, scale):
    N, K = w.shape
    for n in prange(N):
        for b in range(K // 128):
            amax = _amax(w, n, 128 * b, 128)
            s = amax / np.float32(448.0) if amax > 0 else np.float32(1.0)
            scale[n, b] = s
            for j in range(128):
                q[n, 128 * b + j] = _e4m3(w[n, 128 * b + j] / s)


def fp8_rows(w: np.ndarray) -> np.ndarray:
    """w f32 (N, K), K % 128 == 0 -> FP8_E4M3 rows uint8 (N, K / 128 * 132)."""
    from .qtypes import fp8_rows as rows
    w = np.ascontiguousarray(w, np.float32)
    N, K = w.shape
    q = np.empty((N, K), np.uint8)
    scale = np.empty((N, K // 128), np.float32)
    _fp8(w, q, scale)
    return rows(q, scale)
