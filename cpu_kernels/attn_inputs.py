"""The step between the q/k/v projections and attention in one kernel per layer: each head of q and k
QK-normed (optional) and rotated, v normed (optional), k and v stored in the paged cache, q returned as (T, Hq, D). The rows
run the code of rms_norm, rotate and write_kv (the same row functions), so the bits are those of the three
called in turn, without their launches and the copies that made q/k/v contiguous for them."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels.activations import exp_f32
from cpu_kernels.attention import _kernel_view, _slot_place, _store_head
from cpu_kernels.kv_rows import head_dim
from cpu_kernels.norms import _rms_row
from cpu_kernels.rope import _rotate_head

PAR_MIN_ROWS = 8  # as rope's rotate: fewer rows run on the calling thread
_NO_NORM = np.empty(0, np.float32)  # an empty weight: no QK-norm
_F1 = np.float32(1.0)


@njit(cache=True, error_model="numpy")
def _head(src, w, eps32, dst):
    if w.shape[0]:
        _rms_row(src, w, eps32, dst)
    else:
        for d in range(dst.shape[0]):
            dst[d] = src[d]


@njit(cache=True, error_model="numpy")
def _q_row(yq, t, q0, qs, qw, q_eps, cr, sr, neox, q):
    """Row t's query heads q[t] (Hq, D), head h at columns q0 + h * qs: normed (optional) and rotated; the code
    both kernels here run."""
    D = q.shape[2]
    for h in range(q.shape[1]):
        dst = q[t, h]
        _head(yq[t, q0 + h * qs:q0 + h * qs + D], qw, q_eps, dst)
        _rotate_head(dst, cr, sr, neox)


@njit(cache=True, error_model="numpy")
def _rows(yq, q0, qs, yk, k0, yv, v0, qw, kw, vw, q_eps, k_eps, v_eps, cos, sin, neox, k_cache, v_cache,
          slot_mapping, q, t0, t1):
    D, Hkv = q.shape[2], k_cache.shape[2]
    kbuf = np.empty(D, np.float32)
    vbuf = np.empty(D, np.float32)
    for t in range(t0, t1):
        cr, sr = cos[t], sin[t]
        _q_row(yq, t, q0, qs, qw, q_eps, cr, sr, neox, q)
        if slot_mapping[t] < 0:  # padding row
            continue
        blk, off = _slot_place(slot_mapping[t], k_cache)
        for h in range(Hkv):
            _head(yk[t, k0 + h * D:k0 + (h + 1) * D], kw, k_eps, kbuf)
            _rotate_head(kbuf, cr, sr, neox)
            if vw.shape[0]:  # V normed before it is cached (Gemma 4: a weightless norm, w = 1)
                _rms_row(yv[t, v0 + h * D:v0 + (h + 1) * D], vw, v_eps, vbuf)
                _store_head(kbuf, vbuf, k_cache, v_cache, blk, off, h)
            else:
                _store_head(kbuf, yv[t, v0 + h * D:v0 + (h + 1) * D], k_cache, v_cache, blk, off, h)


@njit(cache=True, error_model="numpy", parallel=True)
def _par(yq, q0, qs, yk, k0, yv, v0, qw, kw, vw, q_eps, k_eps, v_eps, cos, sin, neox, k_cache, v_cache, slot_mapping,
         q):
    T = q.shape[0]
    nchunks = min(T, 64)
    for c in prange(nchunks):
        _rows(yq, q0, qs, yk, k0, yv, v0, qw, kw, vw, q_eps, k_eps, v_eps, cos, sin, neox, k_cache, v_cache,
              slot_mapping, q, c * T // nchunks, (c + 1) * T // nchunks)


@njit(cache=True, error_model="numpy")
def _attn_inputs(yq, q0, qs, yk, k0, yv, v0, Hq, qw, kw, vw, q_eps, k_eps, v_eps, cos, sin, neox, k_cache, v_cache,
                 slot_mapping):
    T = yq.shape[0]
    Hkv, D = k_cache.shape[2], head_dim(k_cache)
    if (yk.shape[0] != T or yv.shape[0] != T or slot_mapping.shape[0] != T or cos.shape[0] != T or qs < D
            or q0 + (Hq - 1) * qs + D > yq.shape[1] or k0 + Hkv * D > yk.shape[1] or v0 + Hkv * D > yv.shape[1]
            or 2 * cos.shape[1] > D or v_cache.shape != k_cache.shape
            or (qw.shape[0] and qw.shape[0] != D) or (kw.shape[0] and kw.shape[0] != D)
            or (vw.shape[0] and vw.shape[0] != D)):
        raise ValueError("attn_inputs: q/k/v, the rope table, the norm weights or the cache do not match")
    q = np.empty((T, Hq, D), np.float32)
    qe, ke, ve = np.float32(q_eps), np.float32(k_eps), np.float32(v_eps)
    if T >= PAR_MIN_ROWS:
        _par(yq, q0, qs, yk, k0, yv, v0, qw, kw, vw, qe, ke, ve, cos, sin, neox, k_cache, v_cache, slot_mapping, q)
    else:
        _rows(yq, q0, qs, yk, k0, yv, v0, qw, kw, vw, qe, ke, ve, cos, sin, neox, k_cache, v_cache, slot_mapping, q,
              0, T)
    return q


@njit(cache=True, error_model="numpy")
def _q_rows(yq, q0, qw, q_eps, cos, sin, neox, q, t0, t1):
    for t in range(t0, t1):
        _q_row(yq, t, q0, q.shape[2], qw, q_eps, cos[t], sin[t], neox, q)


@njit(cache=True, error_model="numpy", parallel=True)
def _q_par(yq, q0, qw, q_eps, cos, sin, neox, q):
    T = q.shape[0]
    nchunks = min(T, 64)
    for c in prange(nchunks):
        _q_rows(yq, q0, qw, q_eps, cos, sin, neox, q, c * T // nchunks, (c + 1) * T // nchunks)


@njit(cache=True, error_model="numpy")
def _q_inputs(yq, q0, Hq, D, qw, q_eps, cos, sin, neox):
    T = yq.shape[0]
    if cos.shape[0] != T or q0 + Hq * D > yq.shape[1] or 2 * cos.shape[1] > D or (qw.shape[0] and qw.shape[0] != D):
        raise ValueError("q_inputs: q, the rope table or the norm weight do not match")
    q = np.empty((T, Hq, D), np.float32)
    qe = np.float32(q_eps)
    if T >= PAR_MIN_ROWS:
        _q_par(yq, q0, qw, qe, cos, sin, neox, q)
    else:
        _q_rows(yq, q0, qw, qe, cos, sin, neox, q, 0, T)
    return q


@njit(cache=True, error_model="numpy")
def _sigmoid_gate(out, yg, g0, gs):
    """out (T, Hq, D) *= sigmoid(gate), head h's gate at columns g0 + h * gs .. + D of yg (T, *) (qwen3.5's gated
    attention: q_proj yields [q_h | gate_h] per head)."""
    T, Hq, D = out.shape
    for t in range(T):
        for h in range(Hq):
            orow, gr = out[t, h], yg[t, g0 + h * gs:g0 + h * gs + D]
            for d in range(D):
                orow[d] *= _F1 / (_F1 + exp_f32(-gr[d]))


def sigmoid_gate(out, gate_cols, head_stride):
    """Multiplies attention output f32 (T, Hq, D) in place by sigmoid of the gate columns (y, first column)."""
    y, g0 = gate_cols
    if y.shape[0] != out.shape[0] or g0 + (out.shape[1] - 1) * head_stride + out.shape[2] > y.shape[1]:
        raise ValueError("sigmoid_gate: the gate columns do not match the attention output")
    _sigmoid_gate(out, y, g0, head_stride)


def attn_inputs(q_cols, k_cols, v_cols, num_heads, q_norm, k_norm, cos, sin, neox, k_cache, v_cache, slot_mapping,
                q_stride=0, v_norm=None):
    """q ready for paged_attention; k and v stored at slot_mapping.

    Args:
        q_cols, k_cols, v_cols: (y, first column): the projection's output f32 (T, *) C-contiguous and where
            the part starts in it (one stacked q|k|v output serves all three). num_heads: Hq. q_stride: columns
            from one q head to the next (0: D; 2 D where q_proj yields [q_h | gate_h] per head).
        q_norm, k_norm: (weight f32 (D,), eps), or None for no QK-norm. v_norm: the same for V, or None.
        cos, sin: rope_cos_sin's table (T, R/2). neox: as rope.rotate.
        k_cache, v_cache: (num_blocks, block_size, Hkv, D) float16 or float32, written in place.
        slot_mapping: int64 (T,), negative = padding row (not stored).
    Returns:
        q f32 (T, Hq, D), normed and rotated.
    Raises:
        ValueError: shapes that do not fit together, or a slot past the end of the cache.
    """
    qw, qe = q_norm if q_norm is not None else (_NO_NORM, 0.0)
    kw, ke = k_norm if k_norm is not None else (_NO_NORM, 0.0)
    vw, ve = v_norm if v_norm is not None else (_NO_NORM, 0.0)
    D = head_dim(k_cache)
    return _attn_inputs(q_cols[0], q_cols[1], int(q_stride or D), k_cols[0], k_cols[1], v_cols[0], v_cols[1],
                        num_heads, qw, kw, vw, float(qe), float(ke), float(ve), cos, sin, bool(neox),
                        _kernel_view(k_cache), _kernel_view(v_cache), slot_mapping)


def q_inputs(q_cols, num_heads, head_dim, q_norm, cos, sin, neox):
    """attn_inputs' q alone (a layer that reads another layer's K/V and stores none), or an encoder's uncached k
    (its own norm, the same rotation): f32 (T, heads, D), normed and rotated with attn_inputs' code, so the same bits."""
    qw, qe = q_norm if q_norm is not None else (_NO_NORM, 0.0)
    return _q_inputs(q_cols[0], q_cols[1], num_heads, head_dim, qw, float(qe), cos, sin, bool(neox))
