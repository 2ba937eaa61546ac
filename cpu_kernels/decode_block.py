"""A transformer block of a decode step in one compiled call, assembled from its parts.

A block is residual steps `x = x + post(part(pre(x)))`; block_step runs them in order, and each part's step
(attention, gated MLP, MoE) is picked at compile time by the type of its arguments (the Fused* named tuples
below, built by engine/model/fused_block.py from the block's own modules). Every step calls the kernels the
modules call one by one, with the same thread counts, so the bits are the same; what goes is the Python between
them (a gemma-3-270m layer spent ~25 us there and ~1 us per kernel entering Numba, against ~110 us of kernels).
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import literal_unroll, njit, types
from numba.extending import overload

from cpu_kernels import norms
from cpu_kernels.activations import _gelu_tanh_mul, _silu_mul, _swiglu_oai
from cpu_kernels.attention import _paged_attention, _paged_attention_serial
from cpu_kernels.attn_inputs import _attn_inputs, _sigmoid_gate
from cpu_kernels.delta_net import _gdn_core
from cpu_kernels.mla import _write_latents, head_columns, rope_queries
from cpu_kernels.moe import add_shared, expert_rows, moe_accumulate
from cpu_kernels.norms import residual_rms_norm, rms_norm
from cpu_kernels.quant.packed import gemv_packed, packed_slice
from cpu_kernels.thread_count import get_threads, set_threads

ACT_SILU, ACT_GELU_TANH, ACT_SWIGLU_OAI = 0, 1, 2

# gemvs: packed weights (quant.packed) of (q's group, k's group, v's group, o); dims, nbytes: their output widths
# and bytes; biases: f32 per group output and o ((0,) = none); layout: (k_src, v_src, q0, k0, v0, num_heads, neox,
# q_stride, gate) with k_src 1 = k's columns are in q's group's output, v_src 1 = in q's, 2 = in k's, 0 = v's own,
# q0/k0/v0 the parts' first columns, q_stride the columns from one q head to the next and gate 1 = the output is
# multiplied by sigmoid of each head's gate columns (after its q columns); qk_w: QK-norm weights ((0,) = none);
# f: (q_eps, k_eps, scale, softcap); window: 0 = full; sinks: f32 (Hq,) attention-sink logits ((0,) = none).
FusedAttention = namedtuple("FusedAttention", ("gemvs", "dims", "nbytes", "biases", "layout", "qk_w", "f", "window",
                                               "sinks"))
# gemvs: (gate's group, up's group, down); layout: (up_src, gate0, up0, F, act): up_src 1 = up's columns are in
# gate's group output; gate0/up0 the parts' first columns; F the width of each.
FusedGatedMLP = namedtuple("FusedGatedMLP", ("gemvs", "dims", "nbytes", "layout"))
# router: packed (E, H) weight; experts: (gate, up, down) packed with a leading expert axis; biases: their (E, N)
# f32 biases ((0, 0): none); dims: (E, F, H); nbytes: the router's and one expert's (gate, up, down) bytes; layout:
# (top_k, norm_topk_prob, act, scoring, n_group, topk_group); f: (routed_scale,); router_bias, selection_bias: f32
# ((0,): none); shared: the shared expert's FusedGatedMLP or (); shared_gate: its gate weight ((0,): none).
FusedMoE = namedtuple("FusedMoE", ("router", "experts", "biases", "dims", "nbytes", "layout", "f", "router_bias",
                                   "selection_bias", "shared", "shared_gate"))
# MLA (parts/mla.py): gemvs: packed (q_a's or q's group, kv_a's group, q_b (q's group again without q_a), o); heads:
# (k_b, v_b) packed with a leading head axis; dims, nbytes: the four's output widths and bytes, then one head's k_b
# and v_b bytes; norms: (q_a_norm weight ((0,): no q_a), kv_a_norm weight); layout: (kv_src, q0, kv0, num_heads,
# head_dim, q_lora_rank (0: no q_a), value_dim) with kv_src 1 = kv_a's columns are in the first group's output and
# q0/kv0 the parts' first columns; f: (q_a eps, kv_a eps, scale).
FusedMLA = namedtuple("FusedMLA", ("gemvs", "heads", "dims", "nbytes", "norms", "layout", "f"))
# gemvs: packed weights of (q|k|v's group, z's group, b's group, a's group, out); dims, nbytes: their output widths
# and bytes; layout: (z_src, b_src, a_src, qkv0, z0, b0, a0, Hk, dk, dv, chunk_min): x_src = the index (0-3) of the
# first of those four parts sharing x's group (x's own index: its own GEMV), x0 its first column there; weights:
# (conv weight f32 (K, C), A (Hv,), dt bias (Hv,), gated-norm weight (dv,)); f: (norm eps,).
FusedDeltaNet = namedtuple("FusedDeltaNet", ("gemvs", "dims", "nbytes", "layout", "weights", "f"))
for _cls in (FusedAttention, FusedGatedMLP, FusedMoE, FusedMLA, FusedDeltaNet):
    _cls.__module__ = __name__  # Numba's cache pickles the types by reference


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
def _gemv_bias(p, n_out, nbytes, bias, x, bar, nt):
    """Linear's decode path with its bias ((0,): none) added as numpy adds it."""
    y = _gemv(p, n_out, nbytes, x, bar, nt)
    if bias.shape[0]:
        for t in range(y.shape[0]):
            for n in range(n_out):
                y[t, n] += bias[n]
    return y


@njit(cache=True)
def _norm_threads(x, bar, nt):
    """RMSNorm's and add_and_norm's rule: their kernels run serially below norms.PAR_MIN_ROWS rows anyway (no
    switch), else on one thread when x is small."""
    set_threads(nt if x.shape[0] < norms.PAR_MIN_ROWS else _small(x.nbytes, bar, nt))


@njit(cache=True)
def _act(a, ga, b, ub, f, act, bar, nt):
    """The gated activation of layers.GatedMLP, on one thread when its input is small."""
    set_threads(_small(a.nbytes, bar, nt))
    if act == ACT_GELU_TANH:
        return _gelu_tanh_mul(a, ga, b, ub, f)
    if act == ACT_SWIGLU_OAI:
        return _swiglu_oai(a, ga, b, ub, f)
    return _silu_mul(a, ga, b, ub, f)


@njit(cache=True)
def _attend(q, ctx, scale, window, softcap, k_cache, v_cache, sinks):
    """paged_attention as parts/attention.py runs it: on the calling thread when the work is small."""
    query_start_loc, seq_lens, block_tables, max_seq_len, bar, nt = ctx[5], ctx[6], ctx[7], ctx[8], ctx[9], ctx[10]
    work = q.shape[0] * max_seq_len * q.shape[1] * q.shape[2]
    if work < bar or nt == 1:
        set_threads(1)
        return _paged_attention_serial(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, window,
                                       softcap, np.zeros(0, np.uint8), sinks)
    set_threads(nt)
    return _paged_attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, window, softcap, nt,
                            np.zeros(0, np.uint8), sinks)


@njit(cache=True)
def _attention_step(a, h, ctx):
    """parts/attention.py's Attention: q/k/v, QK-norm + RoPE + cache write, paged attention, o."""
    cos, sin, k_cache, v_cache, slot_mapping, query_start_loc, seq_lens, block_tables, max_seq_len, bar, nt = ctx[:11]
    pq, pk, pv, po = a.gemvs
    nq, nk, nv, no_ = a.dims
    bq, bk, bv, bo = a.nbytes
    k_src, v_src, q0, k0, v0, hq, neox, qs, gate = a.layout
    T = h.shape[0]
    yq = _gemv_bias(pq, nq, bq, a.biases[0], h, bar, nt)
    yk = yq if k_src == 1 else _gemv_bias(pk, nk, bk, a.biases[1], h, bar, nt)
    if v_src == 1:
        yv = yq
    elif v_src == 2:
        yv = yk
    else:
        yv = _gemv_bias(pv, nv, bv, a.biases[2], h, bar, nt)
    set_threads(_small(yq.nbytes, bar, nt))
    q = _attn_inputs(yq, q0, qs, yk, k0, yv, v0, hq, a.qk_w[0], a.qk_w[1], a.f[0], a.f[1], cos, sin, neox != 0,
                     k_cache, v_cache, slot_mapping)
    out = _attend(q, ctx, a.f[2], a.window, a.f[3], k_cache, v_cache, a.sinks)
    if gate:
        _sigmoid_gate(out, yq, q0 + q.shape[2], qs)
    return _gemv_bias(po, no_, bo, a.biases[3], out.reshape(T, hq * q.shape[2]), bar, nt)


@njit(cache=True)
def _mla_step(a, h, ctx):
    """parts/mla.py's MLA: q (through q_a and its norm, or straight) and kv_a, the latent rows into the cache, each
    head's nope query through its k_b and its rope dims rotated, attention over the latent cache, each head's latent
    result through its v_b, o."""
    cos, sin, cache, bar, nt, slot_mapping = ctx[0], ctx[1], ctx[2], ctx[9], ctx[10], ctx[4]
    p1, pkv, pqb, po = a.gemvs
    kb3, vb3 = a.heads
    n1, nkv, nqb, no_ = a.dims
    b1, bkv, bqb, bo, bkb, bvb = a.nbytes
    kv_src, q0, kv0, H, qk, q_lora, vd = a.layout
    L = a.norms[1].shape[0]
    R = 2 * cos.shape[1]
    T = h.shape[0]
    y1 = _gemv(p1, n1, b1, h, bar, nt)
    ykv = y1 if kv_src == 1 else _gemv(pkv, nkv, bkv, h, bar, nt)
    yq, qc = y1, q0
    if q_lora:
        cq_in = y1[:, q0:q0 + q_lora]
        _norm_threads(cq_in, bar, nt)
        yq, qc = _gemv(pqb, nqb, bqb, rms_norm(cq_in, a.norms[0], a.f[0]), bar, nt), 0
    set_threads(_small(ykv.nbytes, bar, nt))
    _write_latents(ykv, kv0, a.norms[1], a.f[1], cos, sin, cache, slot_mapping)
    qn = head_columns(yq, qc, H, qk, qk - R)
    q = np.empty((T, H, L + R), np.float32)
    for hh in range(H):
        q[:, hh, :L] = _gemv(packed_slice(kb3, hh), L, bkb, qn[hh], bar, nt)
    set_threads(_small(yq.nbytes, bar, nt))
    rope_queries(yq, qc, qk, cos, sin, q)
    out = _attend(q, ctx, a.f[2], 0, 0.0, cache, cache, np.zeros(0, np.float32))
    lat = head_columns(out.reshape(T, H * (L + R)), 0, H, L + R, L)
    o_in = np.empty((T, H * vd), np.float32)
    for hh in range(H):
        o_in[:, hh * vd:(hh + 1) * vd] = _gemv(packed_slice(vb3, hh), vd, bvb, lat[hh], bar, nt)
    return _gemv(po, no_, bo, o_in, bar, nt)


@njit(cache=True)
def _delta_net_step(d, h, ctx):
    """parts/delta_net.py's GatedDeltaNet: qkv/z/b/a (stacked or not), the conv + delta rule + gated norm (the
    layer's state pools travel as the cache pair), out."""
    conv_pool, ssm_pool, query_start_loc, bar, nt = ctx[2], ctx[3], ctx[5], ctx[9], ctx[10]
    positions, slots, snap_rows, snap_slots = ctx[11], ctx[12], ctx[13], ctx[14]
    p0, p1, p2, p3, po = d.gemvs
    n0, n1, n2, n3, no_ = d.dims
    b0, b1, b2, b3, bo = d.nbytes
    sz, sb, sa, c0, c1, c2, c3, hk, dk, dv, chunk_min = d.layout
    conv_w, a_neg, dt_bias, norm_w = d.weights
    y0 = _gemv(p0, n0, b0, h, bar, nt)
    y1 = y0 if sz == 0 else _gemv(p1, n1, b1, h, bar, nt)
    if sb == 0:
        y2 = y0
    elif sb == 1:
        y2 = y1
    else:
        y2 = _gemv(p2, n2, b2, h, bar, nt)
    if sa == 0:
        y3 = y0
    elif sa == 1:
        y3 = y1
    elif sa == 2:
        y3 = y2
    else:
        y3 = _gemv(p3, n3, b3, h, bar, nt)
    par = nt > 1 and h.shape[0] * ssm_pool.shape[1] * dk * dv >= bar
    set_threads(nt if par else 1)
    o = _gdn_core(y0, c0, y1, c1, y2, c2, y3, c3, conv_w, a_neg, dt_bias, norm_w, d.f[0], conv_pool, ssm_pool,
                  query_start_loc, positions, slots, snap_rows, snap_slots, hk, dk, dv, chunk_min, par)
    return _gemv(po, no_, bo, o, bar, nt)


@njit(cache=True)
def _mlp_step(m, h, ctx):
    """parts/mlp.py's GatedMLP: down(act(gate(h)) * up(h)), gate|up stacked or not."""
    bar, nt = ctx[9], ctx[10]
    pg, pu, pd = m.gemvs
    ng, nu, nd = m.dims
    bg, bu, bd = m.nbytes
    up_src, gate0, up0, f, act = m.layout
    yg = _gemv(pg, ng, bg, h, bar, nt)
    yu = yg if up_src == 1 else _gemv(pu, nu, bu, h, bar, nt)
    return _gemv(pd, nd, bd, _act(yg, gate0, yu, up0, f, act, bar, nt), bar, nt)


@njit(cache=True)
def _expert_gemv(p3, e, bias2, n_out, nbytes, x, bar, nt):
    """Expert e's GEMV over its stacked weight for the rows x, with its bias row where the experts have biases."""
    y = _gemv(packed_slice(p3, e), n_out, nbytes, x, bar, nt)
    if bias2.shape[0]:
        for t in range(y.shape[0]):
            for n in range(n_out):
                y[t, n] += bias2[e, n]
    return y


def shared_step(shared, h, out, gate_w, ctx):
    """out += the shared expert's output (gated); nothing for () (compiled code only)."""
    raise TypeError("shared_step runs in compiled code only")


@overload(shared_step)
def _shared_step(shared, h, out, gate_w, ctx):
    if getattr(shared, "instance_class", None) is FusedGatedMLP:
        def impl(shared, h, out, gate_w, ctx):
            add_shared(out, _mlp_step(shared, h, ctx), gate_w, h)
        return impl
    if isinstance(shared, types.BaseTuple) and len(shared) == 0:
        return lambda shared, h, out, gate_w, ctx: None
    return None


@njit(cache=True)
def _moe_step(m, h, ctx):
    """parts/moe.py's MoE: router, top-k, each chosen expert's gated MLP over its rows, weighted sum in expert
    order, shared expert."""
    bar, nt = ctx[9], ctx[10]
    E, F, H = m.dims
    br, bg, bu, bd = m.nbytes
    top_k, norm, act, scoring, n_group, topk_group = m.layout
    logits = _gemv_bias(m.router, E, br, m.router_bias, h, bar, nt)
    ids, weights = expert_rows(logits, m.selection_bias, top_k, scoring, n_group, topk_group, norm != 0, m.f[0])
    out = np.zeros_like(h)
    gate3, up3, down3 = m.experts
    gb, ub, db = m.biases
    # Rows grouped by expert, experts in ascending order: each expert's weights are read once for all its rows, and
    # every row takes its experts in the kernel path's order (parts/moe.py).
    count = np.zeros(E + 1, np.int64)
    for t in range(h.shape[0]):
        for j in range(top_k):
            count[ids[t, j] + 1] += 1
    for e in range(E):
        count[e + 1] += count[e]
    fill = count[:E].copy()
    row_of = np.empty(h.shape[0] * top_k, np.int64)
    weight_of = np.empty(h.shape[0] * top_k, np.float32)
    for t in range(h.shape[0]):
        for j in range(top_k):
            e = ids[t, j]
            row_of[fill[e]], weight_of[fill[e]] = t, weights[t, j]
            fill[e] += 1
    for e in range(E):
        lo, hi = count[e], count[e + 1]
        if hi == lo:
            continue
        x = np.empty((hi - lo, h.shape[1]), np.float32)
        for i in range(hi - lo):
            x[i] = h[row_of[lo + i]]
        g = _expert_gemv(gate3, e, gb, F, bg, x, bar, nt)
        u = _expert_gemv(up3, e, ub, F, bu, x, bar, nt)
        y = _expert_gemv(down3, e, db, H, bd, _act(g, 0, u, 0, F, act, bar, nt), bar, nt)
        for i in range(hi - lo):
            moe_accumulate(out[row_of[lo + i]], weight_of[lo + i], y[i])
    shared_step(m.shared, h, out, m.shared_gate, ctx)
    return out


def part_step(part, h, ctx):
    """One part of a block over h (T, H): the step its argument type names (compiled code only)."""
    raise TypeError(f"part_step runs in compiled code only, got {type(part).__name__}")


@overload(part_step)
def _part_step(part, h, ctx):
    cls = getattr(part, "instance_class", None)
    if cls is FusedAttention:
        return lambda part, h, ctx: _attention_step(part, h, ctx)
    if cls is FusedGatedMLP:
        return lambda part, h, ctx: _mlp_step(part, h, ctx)
    if cls is FusedMoE:
        return lambda part, h, ctx: _moe_step(part, h, ctx)
    if cls is FusedMLA:
        return lambda part, h, ctx: _mla_step(part, h, ctx)
    if cls is FusedDeltaNet:
        return lambda part, h, ctx: _delta_net_step(part, h, ctx)
    return None


@njit(cache=True)
def _add_norm(x, y, post_w, next_w, post_eps, next_eps, bar, nt):
    """norm.add_and_norm."""
    _norm_threads(x, bar, nt)
    return residual_rms_norm(x, y, post_w, next_w, post_eps, next_eps)


@njit(cache=True)
def block_step(x, first_norm, steps, cos, sin, k_cache, v_cache, slot_mapping, query_start_loc, seq_lens,
               block_tables, max_seq_len, bar, positions, state_slots, snap_rows, snap_slots):
    """One block over x f32 (T, H) C-contiguous; returns the new x. K/V of the step are written to the cache.

    first_norm: (weight f32 (H,), eps) of the first step's pre-norm ((0,) weight: none). steps: per residual step
    (part args, post-norm weight, post eps, next step's pre-norm weight, its eps), weights (0,) where absent.
    cos/sin: the attention's RoPE table of the step; the rest as paged_attention and attn_inputs take them; bar is
    threads.serial_work() of the step. A linear-attention block gets its state pools as k_cache, v_cache, and reads
    positions, state_slots, snap_rows, snap_slots (delta_net.gdn_core). The caller restores its thread count if this
    raises.
    """
    nt = get_threads()
    ctx = (cos, sin, k_cache, v_cache, slot_mapping, query_start_loc, seq_lens, block_tables, max_seq_len, bar, nt,
           positions, state_slots, snap_rows, snap_slots)
    _norm_threads(x, bar, nt)
    h = rms_norm(x, first_norm[0], first_norm[1]) if first_norm[0].shape[0] else x.copy()
    for st in literal_unroll(steps):
        y = part_step(st[0], h, ctx)
        x, hn = _add_norm(x, y, st[1], st[3], st[2], st[4], bar, nt)
        h = hn if st[3].shape[0] else x
    set_threads(nt)
    return x
