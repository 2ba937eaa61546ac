"""A whole transformer block of a decode step in one compiled call: norm, q/k/v, attention inputs, paged
attention, output projection, residual norms, gated MLP. The same kernels the Python block calls one by one,
with the same thread counts, so the bits are the same; what goes is the Python between them (a gemma-3-270m
layer spent ~25 us there and ~1 us per kernel entering Numba, against ~110 us of kernels).

Covers blocks of pre-norm (llama, qwen3) and sandwich (gemma 3) shape over GEMV weights (engine/model/
fused_block.py decides when a block and a step qualify: no biases, no long prefill chunk in the step)."""
from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels import norms
from cpu_kernels.activations import _gelu_tanh_mul, _silu_mul
from cpu_kernels.attention import _paged_attention, _paged_attention_serial
from cpu_kernels.attn_inputs import _attn_inputs
from cpu_kernels.norms import residual_rms_norm, rms_norm
from cpu_kernels.quant.packed import gemv_packed
from cpu_kernels.thread_count import get_threads, set_threads

ACT_SILU, ACT_GELU_TANH = 0, 1


@njit(cache=True)
def _small(nbytes, bar, nt):
    """threads.serial_if's rule: work under the bar runs on the calling thread alone."""
    return 1 if nbytes < bar else nt


@njit(cache=True)
def _gemv(p, n_out, nbytes, x, bar, nt):
    """Linear's decode path: W's GEMV, on one thread when the weight bytes times the rows are under the bar."""
    set_threads(_small(nbytes * x.shape[0], bar, nt))
    y = np.empty((x.shape[0], n_out), np.float32)
    gemv_packed(p, x, y)
    return y


@njit(cache=True)
def _norm_threads(x, bar, nt):
    """RMSNorm's and add_and_norm's rule: their kernels run serially below norms.PAR_MIN_ROWS rows anyway (no
    switch), else on one thread when x is small."""
    set_threads(nt if x.shape[0] < norms.PAR_MIN_ROWS else _small(x.nbytes, bar, nt))


@njit(cache=True)
def _add_norm(x, y, post_w, next_w, post_eps, next_eps, bar, nt):
    """layers.add_and_norm."""
    _norm_threads(x, bar, nt)
    return residual_rms_norm(x, y, post_w, next_w, post_eps, next_eps)


@njit(cache=True)
def block_step(x, nw, eps, gemvs, dims, nbytes, layout, qk_w, attn_f, window, cos, sin, k_cache, v_cache,
               slot_mapping, query_start_loc, seq_lens, block_tables, max_seq_len, bar):
    """One block over x f32 (T, H) C-contiguous; returns the new x. K/V of the step are written to the cache.

    nw: (attn_norm, post_attn_norm, ffn_norm, post_ffn_norm) f32 weights, (0,) where the block has none;
    eps: their four eps. gemvs: packed weights (packed.packed) of (q's group, k's group, v's group, o,
    gate|up stacked, down); dims and nbytes: their output widths and bytes. layout: (k_src, v_src, q0, k0,
    v0, num_heads, act, neox, gate0, up0): k_src 1 = k's columns are in q's group's output; v_src 1 = in q's,
    2 = in k's, 0 = v's own; q0/k0/v0 the parts' first columns; gate0/up0 those of gate and up (0 and F).
    qk_w: QK-norm weights ((0,): none); attn_f: (q_eps, k_eps, scale, softcap). The rest as paged_attention and
    attn_inputs take them; bar is threads.serial_work() of the step. The caller restores its thread count if
    this raises.
    """
    nt = get_threads()
    T = x.shape[0]
    pq, pk, pv, po, pgu, pdn = gemvs
    nq, nk, nv, no_, ngu, ndn = dims
    bq, bk, bv, bo, bgu, bdn = nbytes
    k_src, v_src, q0, k0, v0, hq, act, neox, gate0, up0 = layout

    _norm_threads(x, bar, nt)
    h = rms_norm(x, nw[0], eps[0])
    yq = _gemv(pq, nq, bq, h, bar, nt)
    yk = yq if k_src == 1 else _gemv(pk, nk, bk, h, bar, nt)
    if v_src == 1:
        yv = yq
    elif v_src == 2:
        yv = yk
    else:
        yv = _gemv(pv, nv, bv, h, bar, nt)

    set_threads(_small(yq.nbytes, bar, nt))
    q = _attn_inputs(yq, q0, yk, k0, yv, v0, hq, qk_w[0], qk_w[1], attn_f[0], attn_f[1], cos, sin, neox != 0,
                     k_cache, v_cache, slot_mapping)
    work = T * max_seq_len * hq * q.shape[2]
    if work < bar or nt == 1:
        set_threads(1)
        a = _paged_attention_serial(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, attn_f[2],
                                    window, attn_f[3], np.zeros(0, np.uint8))
    else:
        set_threads(nt)
        a = _paged_attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, attn_f[2], window,
                             attn_f[3], nt, np.zeros(0, np.uint8))
    o = _gemv(po, no_, bo, a.reshape(T, hq * q.shape[2]), bar, nt)
    x, h = _add_norm(x, o, nw[1], nw[2], eps[1], eps[2], bar, nt)

    gu = _gemv(pgu, ngu, bgu, h, bar, nt)
    set_threads(_small(gu.nbytes, bar, nt))
    f = up0 - gate0  # runtime offsets, not literal 0 and f: those would compile the kernels a second time
    g = _gelu_tanh_mul(gu, gate0, gu, up0, f) if act == ACT_GELU_TANH else _silu_mul(gu, gate0, gu, up0, f)
    d = _gemv(pdn, ndn, bdn, g, bar, nt)
    x, _ = _add_norm(x, d, nw[3], nw[3][:0], eps[3], 0.0, bar, nt)  # an empty next norm: x + post_ffn(d) only
    set_threads(nt)
    return x
