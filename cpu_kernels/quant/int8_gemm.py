"""W8A8 prefill (prefill_dtype int8): the rows of a weight and of the activations quantized symmetrically per row to
int8 (scale = max |value| / 127, round half to even), their int32 dot products from oneDNN's int8 GEMM (torch._int_mm,
VNNI), and the product back in float32: acc x scale_x[row] x scale_w[col] (+ bias)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .simd import CACHE

_NO_BIAS = np.empty(0, np.float32)


@njit(parallel=True, cache=CACHE)
def _quantize_rows(x, q, scales):
    for t in prange(x.shape[0]):
        row, out = x[t], q[t]
        amax = np.float32(0.0)
        for k in range(row.shape[0]):
            amax = max(amax, abs(row[k]))
        d = amax / np.float32(127.0)
        scales[t] = d
        inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
        for k in range(row.shape[0]):
            out[k] = np.int8(np.rint(row[k] * inv))


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 (M, K) C-contiguous -> (int8 (M, K), f32 scales (M,)): x[t] ~ q[t] * scales[t]."""
    q = np.empty(x.shape, np.int8)
    scales = np.empty(x.shape[0], np.float32)
    _quantize_rows(x, q, scales)
    return q, scales


@njit(parallel=True, cache=CACHE)
def _dequantize(acc, sx, sw, bias, y, r0):
    n = acc.shape[1]
    for t in prange(acc.shape[0]):
        src, dst, s = acc[t], y[r0 + t], sx[t]
        for j in range(n):
            dst[j] = np.float32(src[j]) * (s * sw[j])
        if bias.shape[0]:
            for j in range(n):
                dst[j] += bias[j]


def dequantize_into(acc: np.ndarray, sx: np.ndarray, sw: np.ndarray, y: np.ndarray, r0: int,
                    bias: np.ndarray | None = None) -> None:
    """y[r0:r0 + m] = acc int32 (m, N) * sx (m,) [row] * sw (N,) [col] (+ bias (N,)), y f32 (M, N) C-contiguous."""
    _dequantize(acc, sx, sw, _NO_BIAS if bias is None else bias, y, r0)
