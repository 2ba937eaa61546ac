"""Self-attention over the paged KV cache (spec.AttentionSpec): q/k/v projections (stacked where they can be),
optional QK-norm and biases, RoPE, a sliding window, a softcap, attention sinks, qwen3.5's sigmoid output gate
(q_proj yields [q_h | gate_h] per head); Gemma 4's V norm, V taken from the k projection (k_eq_v), and layers that
compute q only and attend over an earlier layer's cache (kv_from: the decoder hands them that layer's K/V)."""
from __future__ import annotations

import numpy as np

from cpu_kernels import attention, attention_sdpa, rope
from cpu_kernels.attention import NO_SINKS
from cpu_kernels.attn_inputs import attn_inputs, q_inputs, sigmoid_gate
from cpu_kernels.quant.threads import serial_if, serial_work
from engine.model.parts.base import Part, packed_linears
from engine.model.parts.linear import Linear, Projections, has, vector
from engine.model.parts.norm import NO_NORM, RMSNorm, norm_args, small_on_one_thread
from engine.model.spec import AttentionSpec, RopeSpec


class Attention(Part):
    def __init__(self, spec: AttentionSpec, ws, cfg, prefix: str, batch_invariant: bool, shared: dict):
        bi = batch_invariant
        self.shared_kv = spec.kv_from >= 0  # q only: K/V are the earlier layer's (the decoder passes its cache)
        own = ("q",) if self.shared_kv else (("q", "k") if spec.k_eq_v else ("q", "k", "v"))
        self.names = {k: prefix + f"attn_{k}.weight" for k in own}
        self.names["o"] = prefix + "attn_output.weight"
        for k in own:
            bias = prefix + f"attn_{k}.bias" if spec.qkv_bias else None
            setattr(self, k, Linear(ws, self.names[k], bias, bi))
        self.o = Linear(ws, self.names["o"], prefix + "attn_output.bias" if spec.o_bias else None, bi)
        # f32 (Hq,), a writable copy: a read-only view of the file would be another kernel signature
        self.sinks = np.array(vector(ws, prefix + "attn_sinks.weight"), np.float32) if spec.sinks else None
        if self.sinks is not None and self.sinks.shape != (cfg.num_heads,):
            raise ValueError(f"{prefix}attn_sinks.weight: {self.sinks.shape} is not one logit per head ({cfg.num_heads})")
        self.q_norm = RMSNorm(ws, prefix + "attn_q_norm.weight", cfg.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(ws, prefix + "attn_k_norm.weight", cfg.rms_norm_eps) \
            if spec.qk_norm and not self.shared_kv else None
        D, nkv = spec.dims(cfg)
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, nkv, D
        # V's norm has no weight: a weight of 1 multiplies exactly
        self.v_norm = (np.ones(D, np.float32), float(cfg.rms_norm_eps)) if spec.v_norm else None
        self.batch_invariant = batch_invariant
        self.scale = spec.scale or D ** -0.5
        self.sliding_window, self.softcap = spec.sliding_window, spec.softcap
        self.neox = spec.rope is not None and spec.rope.neox
        self.output_gate = spec.output_gate
        self.bidirectional = spec.bidirectional
        if self.bidirectional and (self.softcap or self.sinks is not None or self.shared_kv or spec.k_eq_v
                                   or spec.v_norm or spec.output_gate):
            raise NotImplementedError("bidirectional attention with a softcap, sinks, an output gate, V from K, a V "
                                      "norm or another layer's K/V")
        if self.output_gate and self.shared_kv:
            raise NotImplementedError("an output-gated attention reading another layer's K/V is not supported")
        self.q_stride = 2 * D if spec.output_gate else D  # columns from one q head to the next
        key = ("rope", spec.rope, D)
        if key not in shared:  # layers with the same RoPE share one table (and one cos/sin per step)
            shared[key] = rope_tables(spec.rope.dim or D, spec.rope, ws) if spec.rope is not None else NO_ROPE
        self.inv_freq, self.mscale = shared[key]
        self.qkv = Projections(self, own)

    def rope_table(self, meta) -> tuple[np.ndarray, np.ndarray]:
        return step_rope_table(meta, self.inv_freq, self.mscale)

    def __call__(self, x: np.ndarray, meta, kv) -> np.ndarray:
        t, rows = x.shape[0], meta.rows
        cols = self.qkv.columns(x, rows)
        qc = cols[0]
        k_cache, v_cache = kv
        q_norm = None if self.q_norm is None else norm_args(self.q_norm)
        with small_on_one_thread(qc[0]):
            cos, sin = self.rope_table(meta)
            if self.shared_kv:  # the earlier layer wrote this step's K/V already
                q = q_inputs(qc, self.num_heads, self.head_dim, q_norm, cos, sin, self.neox)
            elif self.bidirectional:  # an encoder's whole prompt, never cached: K and V straight from this step
                q = q_inputs(qc, self.num_heads, self.head_dim, q_norm, cos, sin, self.neox)
                k = q_inputs(cols[1], self.num_kv_heads, self.head_dim, norm_args(self.k_norm), cos, sin, self.neox)
                vy, v0 = cols[2]
                v = vy[:, v0:v0 + self.num_kv_heads * self.head_dim].reshape(t, self.num_kv_heads, self.head_dim)
            else:
                kc = cols[1]
                vc = cols[2] if len(cols) > 2 else kc  # k_eq_v: V is the raw k projection
                k_norm = None if self.k_norm is None else norm_args(self.k_norm)
                q = attn_inputs(qc, kc, vc, self.num_heads, q_norm, k_norm, cos, sin, self.neox, k_cache, v_cache,
                                meta.slot_mapping, self.q_stride, self.v_norm)
        # Work ~ query rows x context x heads x head_dim (a decode over a short context is tiny).
        work = t * meta.max_seq_len * self.num_heads * self.head_dim
        long_seqs = None if self.batch_invariant or rows is None else rows.bf16_attention(x)
        if self.bidirectional:
            out = attention_sdpa.bidirectional_attention(q, k, v, meta.query_start_loc, meta.seq_lens, self.scale,
                                                         self.sliding_window)
        elif long_seqs is not None and not self.softcap and self.sinks is None and attention_sdpa.enabled():
            out = attention_sdpa.mixed_attention(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                                 meta.block_tables, self.scale, self.sliding_window, long_seqs)
        else:
            with serial_if(work < serial_work()):
                out = attention.paged_attention(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                                meta.block_tables, self.scale, self.sliding_window, self.softcap,
                                                long_seqs, self.sinks)
        if self.output_gate:
            sigmoid_gate(out, (qc[0], qc[1] + self.head_dim), self.q_stride)
        return self.o(out.reshape(t, self.num_heads * self.head_dim), rows)

    def fused(self):
        from cpu_kernels.decode_block import FusedAttention, FusedQAttention
        from cpu_kernels.quant.packed import packed
        where = self.qkv.where()
        if where is None or self.bidirectional:  # the fused step attends causally
            return None
        groups = [lin for lin, _ in self.qkv.groups]
        qn = norm_args(self.q_norm)
        f = (float(self.scale), float(self.softcap or 0.0))
        sinks = self.sinks if self.sinks is not None else NO_SINKS
        if self.shared_kv:
            (gq, q0), = where
            lins = (groups[gq], self.o)
            if not packed_linears(lins):
                return None
            return FusedQAttention(
                tuple(packed(lin.weight) for lin in lins), tuple(int(lin.weight.N) for lin in lins),
                tuple(int(lin.weight.nbytes) for lin in lins),
                tuple(lin.bias if lin.bias is not None else NO_NORM for lin in lins),
                (q0, int(self.num_heads), int(self.head_dim), int(bool(self.neox))), np.ascontiguousarray(qn[0]),
                (qn[1], *f), int(self.sliding_window or 0), sinks)
        (gq, q0), (gk, k0) = where[:2]
        gv, v0 = where[2] if len(where) > 2 else (gk, k0)  # k_eq_v: V is read from k's columns
        lins = (groups[gq], groups[gk], groups[gv], self.o)
        if not packed_linears(lins):
            return None
        k_src = 1 if gk == gq else 0
        v_src = 1 if gv == gq else (2 if gv == gk else 0)
        kn, vn = norm_args(self.k_norm), self.v_norm or (NO_NORM, 0.0)
        return FusedAttention(
            tuple(packed(lin.weight) for lin in lins), tuple(int(lin.weight.N) for lin in lins),
            tuple(int(lin.weight.nbytes) for lin in lins),
            tuple(lin.bias if lin.bias is not None else NO_NORM for lin in lins),
            (k_src, v_src, q0, k0, v0, int(self.num_heads), int(bool(self.neox)), int(self.q_stride),
             int(self.output_gate)),
            (np.ascontiguousarray(qn[0]), np.ascontiguousarray(kn[0]), np.ascontiguousarray(vn[0])),
            (qn[1], kn[1], *f, vn[1]), int(self.sliding_window or 0), sinks)

    def to_device(self, conv, lp, kv_cache):
        if self.bidirectional:
            raise NotImplementedError("bidirectional attention on a GPU is not supported yet")
        from gpu_kernels.modules import DeviceAttention
        leaves = {k: conv.leaf(getattr(self, k), name, lp) for k, name in self.names.items()}
        return DeviceAttention(self, leaves["q"], leaves.get("k"), leaves.get("v"), leaves["o"], conv.norm(self.q_norm),
                               conv.norm(self.k_norm), conv.ctx, kv_cache=kv_cache, kv_on_host=lp.kv_device == "cpu")


NO_ROPE = (np.zeros(0, np.float32), 1.0)  # no frequencies: cos/sin of 0 columns, every dim passes unchanged


def step_rope_table(meta, inv_freq: np.ndarray, mscale: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of the step's positions: computed by the first layer with this RoPE, shared by the rest."""
    key = ("rope", id(inv_freq), mscale)
    table = meta.step_cache.get(key)
    if table is None:
        table = meta.step_cache[key] = rope.rope_cos_sin(meta.positions, inv_freq, mscale)
    return table


def rope_tables(rotary_dim: int, spec: RopeSpec, ws=None) -> tuple[np.ndarray, float]:
    """inv_freq and mscale of one RoPE over rotary_dim dims; llama.cpp's rope_freqs tensor (Llama 3.1) divides
    inv_freq."""
    inv_freq, mscale = rope.rope_inv_freq(rotary_dim, spec.theta, spec.scaling)
    if spec.freqs_tensor and ws is not None and has(ws, "rope_freqs.weight"):
        inv_freq = (inv_freq / vector(ws, "rope_freqs.weight")).astype(np.float32)
    if spec.pairs:  # proportional RoPE: the other frequencies are 0 (cos 1, sin 0: those pairs pass unchanged)
        inv_freq = np.array(inv_freq, np.float32)
        inv_freq[spec.pairs:] = 0.0
    return np.ascontiguousarray(inv_freq, dtype=np.float32), mscale
