"""Multi-head latent attention (DeepSeek) around the paged attention, in llama.cpp's absorbed form.

A token's cache row (one kv head, K read as V too) is [RMSNorm(latent) (L) | its roped key (R)]; head h's query is
[W_kb[h] q_nope_h (L) | roped q_rope_h (R)], so attention over the rows gives each head its latent result in the
first L dims. These kernels are the steps between the projections and paged_attention, and around W_kb/W_vb's
per-head GEMVs; engine/model/parts/mla.py and the fused decode step (decode_block.py) both call them, so the two
paths give the same bits. Rows run the code of rms_norm and rotate (_rms_row, _rotate_head).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels.attention import _kernel_view, _slot_place
from cpu_kernels.kv_rows import head_dim, store_row
from cpu_kernels.norms import _rms_row
from cpu_kernels.rope import _rotate_head

PAR_MIN_ROWS = 8  # as attn_inputs: fewer rows run on the calling thread
_JIT = dict(cache=True, error_model="numpy")


@njit(**_JIT)
def _latent_rows(ykv, kv0, w, eps32, cos, sin, cache, slot_mapping, t0, t1):
    L = w.shape[0]
    D = head_dim(cache)
    row = np.empty(D, np.float32)
    for t in range(t0, t1):
        if slot_mapping[t] < 0:  # padding row
            continue
        blk, off = _slot_place(slot_mapping[t], cache)
        _rms_row(ykv[t, kv0:kv0 + L], w, eps32, row[:L])
        for d in range(L, D):
            row[d] = ykv[t, kv0 + d]
        _rotate_head(row[L:], cos[t], sin[t], False)
        store_row(row, cache[blk, off, 0])


@njit(cache=True, error_model="numpy", parallel=True)
def _latent_par(ykv, kv0, w, eps32, cos, sin, cache, slot_mapping):
    T = ykv.shape[0]
    nchunks = min(T, 64)
    for c in prange(nchunks):
        _latent_rows(ykv, kv0, w, eps32, cos, sin, cache, slot_mapping, c * T // nchunks, (c + 1) * T // nchunks)


@njit(**_JIT)
def _write_latents(ykv, kv0, w, eps, cos, sin, cache, slot_mapping):
    T, L, D = ykv.shape[0], w.shape[0], head_dim(cache)
    if (cache.shape[2] != 1 or kv0 + D > ykv.shape[1] or slot_mapping.shape[0] != T or cos.shape[0] != T
            or 2 * cos.shape[1] != D - L or L >= D):
        raise ValueError("write_latents: the projection, the norm, the rope table or the cache do not match")
    if T >= PAR_MIN_ROWS:
        _latent_par(ykv, kv0, w, np.float32(eps), cos, sin, cache, slot_mapping)
    else:
        _latent_rows(ykv, kv0, w, np.float32(eps), cos, sin, cache, slot_mapping, 0, T)


@njit(**_JIT)
def _rope_rows(yq, q0, head_dim, cos, sin, q, t0, t1):
    H, D = q.shape[1], q.shape[2]
    R = 2 * cos.shape[1]
    L, nope = D - R, head_dim - R
    for t in range(t0, t1):
        cr, sr = cos[t], sin[t]
        for h in range(H):
            src = q0 + h * head_dim + nope
            dst = q[t, h, L:]
            for d in range(R):
                dst[d] = yq[t, src + d]
            _rotate_head(dst, cr, sr, False)


@njit(cache=True, error_model="numpy", parallel=True)
def _rope_par(yq, q0, head_dim, cos, sin, q):
    T = q.shape[0]
    nchunks = min(T, 64)
    for c in prange(nchunks):
        _rope_rows(yq, q0, head_dim, cos, sin, q, c * T // nchunks, (c + 1) * T // nchunks)


@njit(**_JIT)
def rope_queries(yq, q0, head_dim, cos, sin, q):
    """q[:, h, L:] = head h's rope dims of yq, rotated (pairs (2i, 2i + 1)), for every head.

    Args:
        yq: f32 (T, *) C-contiguous, the query projection; head h's dims start at column q0 + h * head_dim, its
            rope dims are the last R = 2 * cos.shape[1] of them. cos, sin: rope_cos_sin's table (T, R/2).
        q: f32 (T, Hq, L + R), written in its last R dims (the first L hold the absorbed queries).
    """
    T, H, D = q.shape
    R = 2 * cos.shape[1]
    if yq.shape[0] != T or cos.shape[0] != T or q0 + H * head_dim > yq.shape[1] or R >= D or R >= head_dim:
        raise ValueError("rope_queries: the projection, the rope table or q do not match")
    if T >= PAR_MIN_ROWS:
        _rope_par(yq, q0, head_dim, cos, sin, q)
    else:
        _rope_rows(yq, q0, head_dim, cos, sin, q, 0, T)


@njit(**_JIT)
def head_columns(y, c0, num_heads, stride, width):
    """(Hh, T, width) C-contiguous: head h's first `width` columns of y, which start at c0 + h * stride (each head's
    rows in one block, the per-head GEMVs' input)."""
    T = y.shape[0]
    if c0 + (num_heads - 1) * stride + width > y.shape[1]:
        raise ValueError("head_columns: the heads do not fit y")
    out = np.empty((num_heads, T, width), np.float32)
    for h in range(num_heads):
        for t in range(T):
            src, dst = y[t, c0 + h * stride:c0 + h * stride + width], out[h, t]
            for d in range(width):
                dst[d] = src[d]
    return out


def write_latents(ykv_cols, norm, cos, sin, cache, slot_mapping) -> None:
    """Stores each row's [RMSNorm(latent) | roped key] at its slot.

    Args:
        ykv_cols: (y f32 (T, *) C-contiguous, first column): attn_kv_a_mqa's output, latent (L) then key (R).
        norm: (attn_kv_a_norm weight f32 (L,), eps). cos, sin: rope_cos_sin's table (T, R/2).
        cache: (num_blocks, block_size, 1, L + R) float16 or float32, written in place.
        slot_mapping: int64 (T,), negative = padding row (not stored).
    Raises:
        ValueError: shapes that do not fit together, or a slot past the end of the cache.
    """
    _write_latents(ykv_cols[0], ykv_cols[1], norm[0], float(norm[1]), cos, sin, _kernel_view(cache), slot_mapping)
