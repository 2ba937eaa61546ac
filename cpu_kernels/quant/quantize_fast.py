"""Parallel quantizers for loading float weights into a quantized type (vLLM's `quantization` argument): bit-equal
to gguf's numpy Q8_0 quantizer (llama.cpp's reference) and to torch's float8 cast, at ~GB/s instead of ~100 MB/s.

q8_0_rows(w f32 (N, K)) -> GGUF Q8_0 rows; q4_k_rows(w) -> GGUF Q4_K rows, quantize._q4_k's min-max quantizer bit for
bit; fp8_rows(w f32 (N, K)) -> RamlmType.FP8_E4M3 rows (a scale per 128
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


@njit(parallel=True, cache=CACHE)
def _k4_ranges(w, scale, mn):
    """Per 32 values: the min-max quantizer's step (max + mn) / 15 and offset mn = max(0, -min), float32 (as
    quantize._q45_k)."""
    N, K = w.shape
    for n in prange(N):
        for b in range(K // 32):
            lo = w[n, 32 * b]
            hi = lo
            for j in range(32 * b + 1, 32 * b + 32):
                lo = min(lo, w[n, j])
                hi = max(hi, w[n, j])
            m = max(np.float32(0.0), -lo)
            mn[n, b] = m
            scale[n, b] = (hi + m) / np.float32(15.0)


@njit(cache=CACHE, inline="always")
def _step(a, b, top):
    """clip(rint(a / b), 0, top) with a / 0 taken as 0 (quantize._safe_div)."""
    v = np.rint(a / b) if b != 0 else np.float32(0.0)
    return np.uint8(min(max(v, 0.0), top))


@njit(parallel=True, cache=CACHE)
def _q4_k(w, scale, mn, d, dmin, out):
    N, K = w.shape
    for n in prange(N):
        for s in range(K // 256):
            o = 144 * s
            for j in range(8):
                sc = _step(scale[n, 8 * s + j], d[n, s], 63)
                m = _step(mn[n, 8 * s + j], dmin[n, s], 63)
                if j < 4:  # ggml's get_scale_min_k4 packing of the 6-bit scales and mins
                    out[n, o + 4 + j] = sc
                    out[n, o + 8 + j] = m
                else:
                    out[n, o + j] |= (sc >> 4) << 6
                    out[n, o + 4 + j] |= (m >> 4) << 6
                    out[n, o + 8 + j] = (sc & 15) | ((m & 15) << 4)
                dl, ml = d[n, s] * np.float32(sc), dmin[n, s] * np.float32(m)
                for i in range(32):  # sub-block j: byte 32 (j // 2) + i, low nibble for even j, high for odd
                    q = _step(w[n, 256 * s + 32 * j + i] + ml, dl, 15)
                    at = o + 16 + 32 * (j >> 1) + i
                    out[n, at] = q if j % 2 == 0 else out[n, at] | (q << 4)


def q4_k_rows(w: np.ndarray) -> np.ndarray:
    """w f32 (N, K), K % 256 == 0 -> Q4_K rows uint8 (N, K / 256 * 144), what quantize._q4_k gives (its min-max
    quantizer, bit for bit)."""
    w = np.ascontiguousarray(w, np.float32)
    N, K = w.shape
    scale, mn = np.empty((N, K // 32), np.float32), np.empty((N, K // 32), np.float32)
    _k4_ranges(w, scale, mn)
    d = (scale.reshape(N, -1, 8).max(-1) / np.float32(63)).astype(np.float16)
    dmin = (mn.reshape(N, -1, 8).max(-1) / np.float32(63)).astype(np.float16)
    out = np.empty((N, K // 256 * 144), np.uint8)
    _q4_k(w, scale, mn, d.astype(np.float32), dmin.astype(np.float32), out)
    head = out.reshape(N, -1, 144)
    head[..., 0:2] = d.view(np.uint8).reshape(N, -1, 2)
    head[..., 2:4] = dmin.view(np.uint8).reshape(N, -1, 2)
    return out


@njit(parallel=True, cache=CACHE)
def _int_rtn(w, s32, bits, group, out):
    N, K = w.shape
    top = (1 << (bits - 1)) - 1
    size = 18 if bits == 4 else 34
    for n in prange(N):
        for b in range(K // 32):
            s = s32[n, (32 * b) // group]
            o = b * size + 2
            if bits == 8:
                for j in range(32):
                    v = min(max(np.rint(w[n, 32 * b + j] / s), -top - 1), top)
                    out[n, o + j] = np.uint8((np.int64(v) + 256) & 255)
            else:
                for j in range(16):
                    lo = min(max(np.rint(w[n, 32 * b + j] / s), -top - 1), top)
                    hi = min(max(np.rint(w[n, 32 * b + 16 + j] / s), -top - 1), top)
                    out[n, o + j] = np.uint8((np.int64(lo) + 8) | ((np.int64(hi) + 8) << 4))


def int_rtn_rows(w: np.ndarray, bits: int, group: int) -> np.ndarray:
    """w f32 (N, K) -> Q8_0 (bits 8) or Q4_0 (bits 4) rows of its symmetric round-to-nearest integers, one fp16 scale
    amax / (2^(bits-1) - 1) per `group` values of a row (a multiple of 32), the values rounded at that stored scale."""
    w = np.ascontiguousarray(w, np.float32)
    N, K = w.shape
    top = (1 << (bits - 1)) - 1
    amax = np.abs(w.reshape(N, K // group, group)).max(axis=-1)
    scale = np.where(amax > 0, amax / np.float32(top), np.float32(1.0)).astype(np.float16)
    size = 18 if bits == 4 else 34
    out = np.empty((N, K // 32 * size), np.uint8)
    _int_rtn(w, scale.astype(np.float32), bits, group, out)
    out.reshape(N, -1, size)[..., :2] = np.repeat(scale, group // 32, axis=1).view(np.uint8).reshape(N, -1, 2)
    return out
