"""RMSNorm, as HF computes it in float32: y = x * rsqrt(mean(x^2) + eps) * w.

The sum of squares is accumulated in float64 (exact squares, vectorized), so it is at least as accurate
as torch's float32 mean; the scaling itself is float32, in HF's order. Each row is computed by the same
code whatever T is, so a row's result does not depend on the rest of the batch.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

PAR_MIN_ROWS = 16  # below this a parallel launch costs more than it saves (and rms_norm runs serially)
_F1 = np.float32(1.0)


@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def _sum_squares(row):
    # reassoc lets LLVM vectorize the sum; the order is fixed by the compiled code, not by the batch.
    s = 0.0
    for i in range(row.shape[0]):
        v = np.float64(row[i])
        s += v * v
    return s


@njit(cache=True, error_model="numpy")
def _rms_row(xr, w, eps32, orow):
    """One row: the code every RMSNorm here runs (rms_norm, the fused kernels), so their bits agree."""
    H = xr.shape[0]
    var = np.float32(_sum_squares(xr) / H)
    r = _F1 / np.sqrt(var + eps32)
    for i in range(H):
        orow[i] = (xr[i] * r) * w[i]


@njit(cache=True, error_model="numpy")
def _rms_rows(x, w, eps32, out, t0, t1):
    for t in range(t0, t1):
        _rms_row(x[t], w, eps32, out[t])  # row slices: out[t, i] over a runtime t kept the loop scalar


@njit(cache=True, error_model="numpy", parallel=True)
def _rms_par(x, w, eps32, out):
    T = x.shape[0]
    nchunks = min(T, 64)
    for c in prange(nchunks):
        _rms_rows(x, w, eps32, out, c * T // nchunks, (c + 1) * T // nchunks)


@njit(cache=True, error_model="numpy")
def rms_norm(x, w, eps, unit_offset=False):
    """RMSNorm over the last axis.

    Args:
        x: f32 (T, H), any strides. w: f32 (H,). eps: float.
        unit_offset: scale by (1 + w) (HF Gemma's raw weights; GGUF gemma weights already include the +1).
    Returns:
        new f32 (T, H) C-contiguous.

    Per-head norm (QK-norm) of x (T, Hh, D) over D: rms_norm_heads below, or reshape to (T * Hh, D).
    """
    T, H = x.shape
    out = np.empty((T, H), np.float32)
    if unit_offset:
        ww = np.empty(H, np.float32)
        for i in range(H):
            ww[i] = _F1 + w[i]
    else:
        ww = w.astype(np.float32)
    eps32 = np.float32(eps)
    if T >= PAR_MIN_ROWS:
        _rms_par(x, ww, eps32, out)
    else:
        _rms_rows(x, ww, eps32, out, 0, T)
    return out


@njit(cache=True, error_model="numpy")
def rms_norm_heads(x, w, eps, unit_offset=False):
    """QK-norm: x f32 (T, Hh, D) C-contiguous, w f32 (D,) -> new f32 (T, Hh, D), each head normalized over D."""
    T, Hh, D = x.shape
    return rms_norm(x.reshape(T * Hh, D), w, eps, unit_offset).reshape(T, Hh, D)


@njit(cache=True, error_model="numpy")
def _residual_rows(x, y, post_w, next_w, post_eps, next_eps, x_out, h_out, t0, t1):
    H = x.shape[1]
    tmp = np.empty(H, np.float32)
    for t in range(t0, t1):
        xr, yr, xo = x[t], y[t], x_out[t]
        if post_w.shape[0]:
            _rms_row(yr, post_w, post_eps, tmp)
            for i in range(H):
                xo[i] = xr[i] + tmp[i]
        else:
            for i in range(H):
                xo[i] = xr[i] + yr[i]
        if next_w.shape[0]:
            _rms_row(xo, next_w, next_eps, h_out[t])


@njit(cache=True, error_model="numpy", parallel=True)
def _residual_par(x, y, post_w, next_w, post_eps, next_eps, x_out, h_out):
    T = x.shape[0]
    nchunks = min(T, 64)
    for c in prange(nchunks):
        _residual_rows(x, y, post_w, next_w, post_eps, next_eps, x_out, h_out, c * T // nchunks,
                       (c + 1) * T // nchunks)


@njit(cache=True, error_model="numpy")
def residual_rms_norm(x, y, post_w, next_w, post_eps, next_eps):
    """A block's residual step in one call: x' = x + rms_norm(y, post_w) (x + y when post_w is empty), then
    h = rms_norm(x', next_w) (an empty (T, 0) h when next_w is empty). Each row's bits are those of
    rms_norm and numpy's add done one after another (the same row code), without their separate launches.

    Args:
        x, y: f32 (T, H) C-contiguous. post_w, next_w: f32 (H,) or (0,). post_eps, next_eps: float.
    Returns:
        (x' new f32 (T, H), h new f32 (T, H) or (T, 0)).
    """
    T, H = x.shape
    if y.shape != x.shape or (post_w.shape[0] and post_w.shape[0] != H) or (next_w.shape[0] and next_w.shape[0] != H):
        raise ValueError("residual_rms_norm: x, y and the weights do not match")
    x_out = np.empty((T, H), np.float32)
    h_out = np.empty((T, H if next_w.shape[0] else 0), np.float32)
    pe, ne = np.float32(post_eps), np.float32(next_eps)
    if T >= PAR_MIN_ROWS:
        _residual_par(x, y, post_w, next_w, pe, ne, x_out, h_out)
    else:
        _residual_rows(x, y, post_w, next_w, pe, ne, x_out, h_out, 0, T)
    return x_out, h_out
