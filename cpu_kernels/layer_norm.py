"""LayerNorm, as torch computes it in float32: y = (x - mean) / sqrt(var + eps) * w + b (biased variance), and a
post-norm block's residual step LN(x + y) in one call (BERT). Mean and variance are accumulated in float64 over
the row, two passes; the scaling is float32. A row's result does not depend on the rest of the batch."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels.norms import PAR_MIN_ROWS

_F1 = np.float32(1.0)


@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def _moments(row):
    # reassoc lets LLVM vectorize both sums; their order is fixed by the compiled code, not by the batch
    s = 0.0
    for i in range(row.shape[0]):
        s += np.float64(row[i])
    mean = s / row.shape[0]
    q = 0.0
    for i in range(row.shape[0]):
        d = np.float64(row[i]) - mean
        q += d * d
    return mean, q / row.shape[0]


@njit(cache=True, error_model="numpy")
def _ln_row(xr, w, b, eps32, orow):
    """One row: the code every LayerNorm here runs."""
    mean, var = _moments(xr)
    m32 = np.float32(mean)
    r = _F1 / np.sqrt(np.float32(var) + eps32)
    for i in range(xr.shape[0]):
        orow[i] = (xr[i] - m32) * r * w[i] + b[i]


@njit(cache=True, error_model="numpy")
def _rows(x, y, w, b, eps32, out, t0, t1):
    H = x.shape[1]
    tmp = np.empty(H, np.float32)
    for t in range(t0, t1):
        if y.shape[0]:
            xr, yr = x[t], y[t]
            for i in range(H):
                tmp[i] = xr[i] + yr[i]
            _ln_row(tmp, w, b, eps32, out[t])
        else:
            _ln_row(x[t], w, b, eps32, out[t])


@njit(cache=True, error_model="numpy", parallel=True)
def _par(x, y, w, b, eps32, out):
    T = x.shape[0]
    nchunks = min(T, 64)
    for c in prange(nchunks):
        _rows(x, y, w, b, eps32, out, c * T // nchunks, (c + 1) * T // nchunks)


@njit(cache=True, error_model="numpy")
def _layer_norm(x, y, w, b, eps):
    T, H = x.shape
    if (y.shape[0] and y.shape != x.shape) or w.shape[0] != H or b.shape[0] != H:
        raise ValueError("layer_norm: x, y and the weights do not match")
    out = np.empty((T, H), np.float32)
    if T >= PAR_MIN_ROWS:
        _par(x, y, w, b, np.float32(eps), out)
    else:
        _rows(x, y, w, b, np.float32(eps), out, 0, T)
    return out


_NO_Y = np.empty((0, 0), np.float32)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """x f32 (T, H) C-contiguous, w, b f32 (H,) -> new f32 (T, H): LayerNorm of each row."""
    return _layer_norm(x, _NO_Y, w, b, float(eps))


def residual_layer_norm(x: np.ndarray, y: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """x, y f32 (T, H) C-contiguous -> new f32 (T, H): LayerNorm(x + y), a post-norm block's residual step (the sum
    rounded to float32 first, as torch adds before it norms)."""
    return _layer_norm(x, y, w, b, float(eps))
