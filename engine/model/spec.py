"""What a layer is made of, as plain data: an architecture file returns one BlockSpec per layer, and everything
else is derived from it (the CPU modules, the fused decode step, the GPU modules, the tensors a file must hold).

A block is residual steps, each `x = after(x + post(part(pre(x))))` where pre, post and after are norms (or absent:
RMSNorms, or LayerNorms with a bias where BlockSpec.norm says so) and part is one of the part specs below. Tensor
names are GGUF's, relative to the layer (`blk.{i}.`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cpu_kernels.rope import RopeScaling
from engine.core.kv_spec import LayerCache, LayerKV, LayerState


@dataclass(frozen=True)
class RopeSpec:
    """One RoPE table: base, scaling, pairing (neox: (i, i + d/2); else (2i, 2i + 1), llama's permuted GGUF
    rows, both within the rotated dims), whether llama.cpp's rope_freqs.weight tensor (llama 3.1's scaling) divides
    the frequencies, and how many leading dims rotate. pairs: proportional RoPE (Gemma 4's full layers): the
    frequencies run over the whole dim but only the first `pairs` turn, the rest are 0 (pairs (j, j + d/2))."""
    theta: float
    scaling: RopeScaling = field(default_factory=RopeScaling)
    neox: bool = False
    freqs_tensor: bool = False
    dim: int = 0  # rotated dims of a head, the first ones (partial rotary); 0 = all
    pairs: int = 0  # turning frequencies (proportional RoPE); 0 = all


@dataclass(frozen=True)
class AttentionSpec:
    """Self-attention over the paged KV cache: attn_q/k/v/output (+ .bias with qkv_bias; attn_output.bias with
    o_bias), attn_q_norm/attn_k_norm (per-head RMSNorm) with qk_norm, a sliding window (0 = full), a logit softcap
    (0 = none), the score scale (0 = head_dim ** -0.5) and attention sinks (attn_sinks.weight: a learned logit per
    query head added to the softmax's denominator only, gpt-oss). output_gate: attn_q yields [q_h | gate_h] per head
    (2 head_dim rows each) and the attention output is multiplied by sigmoid(gate) before attn_output (qwen3.5).
    Gemma 4: head_dim / num_kv_heads of the layer (0 = cfg's); k_eq_v: no attn_v, V is the raw attn_k output; v_norm:
    V RMSNormed (no weight) before it is cached; kv_from >= 0: the layer computes q only and attends over layer
    kv_from's cache (no attn_k, attn_v, attn_k_norm and no cache of its own). bidirectional: encoder attention over
    the whole prompt, which then runs in one step (EmbeddingGemma). rope None: no rotation (absolute position
    embeddings, BERT)."""
    rope: RopeSpec | None
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int = 0
    softcap: float = 0.0
    scale: float = 0.0
    o_bias: bool = False
    sinks: bool = False
    output_gate: bool = False
    head_dim: int = 0
    num_kv_heads: int = 0
    k_eq_v: bool = False
    v_norm: bool = False
    kv_from: int = -1
    bidirectional: bool = False  # every row attends over its whole prompt (a sliding layer: |i - j| < window)

    def dims(self, cfg) -> tuple[int, int]:
        """(head_dim, kv heads) of the layer."""
        return self.head_dim or cfg.head_dim, self.num_kv_heads or cfg.num_kv_heads

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        D, nkv = self.dims(cfg)
        H, hq, hkv = cfg.hidden_size, cfg.num_heads * D, nkv * D
        own = ("q",) if self.kv_from >= 0 else (("q", "k") if self.k_eq_v else ("q", "k", "v"))
        rows = {"q": 2 * hq if self.output_gate else hq, "k": hkv, "v": hkv}
        out = {f"attn_{p}.weight": (rows[p], H) for p in own}
        out["attn_output.weight"] = (H, hq)
        if self.qkv_bias:
            out.update({f"attn_{p}.bias": (rows[p],) for p in own})
        if self.qk_norm:
            out.update({f"attn_{p}_norm.weight": (D,) for p in own if p != "v"})
        if self.o_bias:
            out["attn_output.bias"] = (H,)
        if self.sinks:
            out["attn_sinks.weight"] = (cfg.num_heads,)
        return out

    def kv(self, cfg) -> LayerKV:
        """Its paged cache per token: K and V of every kv head (only the window's last tokens on a sliding layer), or
        none of its own (kv_from: layer kv_from's)."""
        D, nkv = self.dims(cfg)
        return LayerKV(nkv, D, shared_from=self.kv_from, window=self.sliding_window)


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek's multi-head latent attention in llama.cpp's absorbed form. q comes from attn_q_a (RMSNorm
    attn_q_a_norm) then attn_q_b, or from attn_q alone (q_lora_rank 0); each head's q (cfg.head_dim = nope + rope
    dims) splits into nope and rope dims. attn_kv_a_mqa gives the latent (kv_lora_rank, RMSNorm attn_kv_a_norm) and
    one rope key shared by all heads; RoPE turns the rope dims only. attn_k_b (heads, kv_lora_rank, nope) takes each
    head's nope query into the latent space, so the cache holds per token only [latent | roped key] (one kv head,
    K serving as V); each head's latent output goes back through attn_v_b (heads, value_dim, kv_lora_rank) to
    attn_output. scale: the softmax scale (YaRN's mscale^2 / sqrt(head_dim))."""
    rope: RopeSpec
    q_lora_rank: int
    kv_lora_rank: int
    value_dim: int
    scale: float

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        H, nh, qk, r = cfg.hidden_size, cfg.num_heads, cfg.head_dim, self.rope.dim
        lat, v = self.kv_lora_rank, self.value_dim
        out = {"attn_kv_a_mqa.weight": (lat + r, H), "attn_kv_a_norm.weight": (lat,),
               "attn_k_b.weight": (nh, lat, qk - r), "attn_v_b.weight": (nh, v, lat), "attn_output.weight": (H, nh * v)}
        if self.q_lora_rank:
            out.update({"attn_q_a.weight": (self.q_lora_rank, H), "attn_q_a_norm.weight": (self.q_lora_rank,),
                        "attn_q_b.weight": (nh * qk, self.q_lora_rank)})
        else:
            out["attn_q.weight"] = (nh * qk, H)
        return out

    def kv(self, cfg) -> LayerKV:
        """Its paged cache per token: the latent and the roped key, one row read as both K and V."""
        return LayerKV(1, self.kv_lora_rank + self.rope.dim, v_is_k=True)


@dataclass(frozen=True)
class GatedMLPSpec:
    """down(act(gate(x)) * up(x)) over {prefix}_gate/_up/_down{suffix} (shared experts: suffix "_shexp"); act is
    silu or gelu_tanh; width 0 = cfg.intermediate_size."""
    act: str = "silu"
    width: int = 0
    prefix: str = "ffn"
    suffix: str = ""

    def names(self) -> dict[str, str]:
        p, s = self.prefix, self.suffix
        return {"gate": f"{p}_gate{s}.weight", "up": f"{p}_up{s}.weight", "down": f"{p}_down{s}.weight"}

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        H, F = cfg.hidden_size, self.width or cfg.intermediate_size
        n = self.names()
        return {n["gate"]: (F, H), n["up"]: (F, H), n["down"]: (H, F)}


@dataclass(frozen=True)
class MLPSpec:
    """down(act(up(x))) over ffn_up/ffn_down, with their .bias where bias (BERT's feed-forward); act: gelu (erf)."""
    act: str = "gelu"
    bias: bool = True

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        H, F = cfg.hidden_size, cfg.intermediate_size
        out = {"ffn_up.weight": (F, H), "ffn_down.weight": (H, F)}
        if self.bias:
            out.update({"ffn_up.bias": (F,), "ffn_down.bias": (H,)})
        return out


@dataclass(frozen=True)
class MoESpec:
    """A router (ffn_gate_inp) picking top_k of num_experts gated experts per token (ffn_gate/up/down_exps, stacked
    (E, N, K)), their outputs added with the router's weights, plus an optional shared expert.

    scoring: softmax (over all experts), sigmoid, or topk_softmax (choose on the raw logits, softmax over the
    chosen: gpt-oss). selection_bias: exp_probs_b.bias is added to the scores for the choice only (DeepSeek's
    correction bias). n_group/topk_group: only the experts of the topk_group best groups (by their two best scores)
    compete. norm_topk_prob: the chosen weights are renormalized; routed_scale multiplies them. router_bias /
    expert_bias: ffn_gate_inp.bias / ffn_{gate,up,down}_exps.bias. act: silu, gelu_tanh or swiglu_oai (gpt-oss's
    clamped SwiGLU). shared: an always-on expert added to the output, scaled by sigmoid(ffn_gate_inp_shexp . x)
    with shared_gate (qwen3.5). Gemma 4: router_input_norm: the router reads RMSNorm(x) (no weight) times
    ffn_gate_inp.scale times H^-0.5; expert_scale: ffn_down_exps.scale (E,) multiplies each chosen expert's weight;
    gate_up: the experts' gate and up rows stacked in ffn_gate_up_exps (E, 2F, H), gate first."""
    num_experts: int
    top_k: int
    width: int
    norm_topk_prob: bool = True
    act: str = "silu"
    scoring: str = "softmax"
    selection_bias: bool = False
    n_group: int = 1
    topk_group: int = 1
    routed_scale: float = 1.0
    router_bias: bool = False
    expert_bias: bool = False
    shared: GatedMLPSpec | None = None
    shared_gate: bool = False
    router_input_norm: bool = False
    expert_scale: bool = False
    gate_up: bool = False

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        H, E, F = cfg.hidden_size, self.num_experts, self.width
        out = {"ffn_gate_inp.weight": (E, H), "ffn_gate_exps.weight": (E, F, H), "ffn_up_exps.weight": (E, F, H),
               "ffn_down_exps.weight": (E, H, F)}
        if self.gate_up:
            del out["ffn_gate_exps.weight"], out["ffn_up_exps.weight"]
            out["ffn_gate_up_exps.weight"] = (E, 2 * F, H)
        if self.router_input_norm:
            out["ffn_gate_inp.scale"] = (H,)
        if self.expert_scale:
            out["ffn_down_exps.scale"] = (E,)
        if self.router_bias:
            out["ffn_gate_inp.bias"] = (E,)
        if self.selection_bias:
            out["exp_probs_b.bias"] = (E,)
        if self.expert_bias:
            out.update({"ffn_gate_exps.bias": (E, F), "ffn_up_exps.bias": (E, F), "ffn_down_exps.bias": (E, H)})
        if self.shared is not None:
            out.update(self.shared.tensors(cfg))
        if self.shared_gate:
            out["ffn_gate_inp_shexp.weight"] = (H,)
        return out


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    """Gated DeltaNet linear attention (qwen3.5): attn_qkv (q|k|v rows, value heads in GGUF's tiled order: value head
    h reads key head h % num_k_heads), attn_gate (z), ssm_beta (b), ssm_alpha (a), ssm_conv1d (C, K) depthwise,
    ssm_dt.bias, ssm_a (= -exp(A_log)), ssm_norm (v_head_dim, a plain weight), ssm_out. A sequence keeps a fixed-size
    state instead of KV blocks (kv)."""
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int = 4

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.k_head_dim + self.num_v_heads * self.v_head_dim

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        H, C, Hv = cfg.hidden_size, self.conv_dim, self.num_v_heads
        V = Hv * self.v_head_dim
        return {"attn_qkv.weight": (C, H), "attn_gate.weight": (V, H), "ssm_beta.weight": (Hv, H),
                "ssm_alpha.weight": (Hv, H), "ssm_conv1d.weight": (C, self.conv_kernel), "ssm_dt.bias": (Hv,),
                "ssm_a": (Hv,), "ssm_norm.weight": (self.v_head_dim,), "ssm_out.weight": (H, V)}

    def kv(self, cfg) -> LayerState:
        """Its cache: no paged blocks, one sequence's float32 states: the conv inputs (K - 1, C) and the delta rule's
        S (Hv, dk, dv)."""
        return LayerState(((self.conv_kernel - 1, self.conv_dim),
                           (self.num_v_heads, self.k_head_dim, self.v_head_dim)))


@dataclass(frozen=True)
class ParallelFFNSpec:
    """A dense gated MLP and a MoE side by side over the same residual input x (Gemma 4):
    mlp_post(mlp(mlp_pre(x))) + moe_post(moe(moe_pre(x))), the MoE's router reading x itself. norms: the four RMSNorm
    tensors (mlp_pre, mlp_post, moe_pre, moe_post)."""
    mlp: GatedMLPSpec
    moe: MoESpec
    norms: tuple[str, str, str, str] = ("ffn_norm", "post_ffw_norm_1", "pre_ffw_norm_2", "post_ffw_norm_2")

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        out = {n + ".weight": (cfg.hidden_size,) for n in self.norms}
        return {**out, **self.mlp.tensors(cfg), **self.moe.tensors(cfg)}


@dataclass(frozen=True)
class PerLayerInputSpec:
    """x -> proj(act(inp_gate(x)) * e): e is this layer's share (width P) of the per-layer embeddings, computed once
    per token before the layers (PerLayerEmbeddingSpec); inp_gate (P, H), proj (H, P). Gemma 4's PLE."""
    width: int
    layer: int
    act: str = "gelu_tanh"

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        H, P = cfg.hidden_size, self.width
        return {"inp_gate.weight": (P, H), "proj.weight": (H, P)}


@dataclass(frozen=True)
class PerLayerEmbeddingSpec:
    """Per-layer embeddings of every token, before the layers (Gemma 4): (RMSNorm(per_layer_model_proj(x) H^-0.5,
    per_layer_proj_norm) + per_layer_token_embd[ids] sqrt(P)) 2^-0.5, (T, layers, P); x the scaled token embedding."""
    width: int
    num_layers: int

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        H, LP = cfg.hidden_size, self.width * self.num_layers
        return {"per_layer_token_embd.weight": (cfg.vocab_size, LP), "per_layer_model_proj.weight": (LP, H),
                "per_layer_proj_norm.weight": (self.width,)}


@dataclass(frozen=True)
class AbsoluteEmbeddingSpec:
    """Learned absolute positions (BERT's embeddings): LayerNorm(x + position_embd[pos] + token_types[type]), x the
    token embedding, norm token_embd_norm (.weight, .bias). Positions count from 0 (RoBERTa's first padding_idx + 1
    rows are dropped at load, as llama.cpp's converter drops them)."""
    num_positions: int
    num_types: int

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        H = cfg.hidden_size
        out = {"position_embd.weight": (self.num_positions, H), "token_embd_norm.weight": (H,),
               "token_embd_norm.bias": (H,)}
        if self.num_types:
            out["token_types.weight"] = (self.num_types, H)
        return out


@dataclass(frozen=True)
class Residual:
    """x = after(x + post(part(pre(x)))); pre, post and after name norm tensors (None: no norm); after: post-norm
    (BERT's LayerNorm of the residual sum)."""
    part: object
    pre: str | None
    post: str | None = None
    after: str | None = None


@dataclass(frozen=True)
class BlockSpec:
    """The residual steps in order; out_scale: a (1,) tensor multiplying the block's output (Gemma 4's layer scalar),
    used where the file has it. norm: "rms" (RMSNorm, .weight) or "layer" (LayerNorm, .weight and .bias)."""
    steps: tuple[Residual, ...]
    out_scale: str | None = None
    norm: str = "rms"

    def tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        """Every tensor of the layer (names relative to blk.{i}.) and its shape (numpy order)."""
        out: dict[str, tuple[int, ...]] = {}
        for st in self.steps:
            for norm in (st.pre, st.post, st.after):
                if norm:
                    out[norm + ".weight"] = (cfg.hidden_size,)
                    if self.norm == "layer":
                        out[norm + ".bias"] = (cfg.hidden_size,)
            out.update(st.part.tensors(cfg))
        if self.out_scale:
            out[self.out_scale] = (1,)
        return out

    def kv(self, cfg) -> LayerCache:
        """The layer's cache: its attention part's paged blocks (LayerKV), or its linear-attention part's
        per-sequence state (LayerState)."""
        for st in self.steps:
            if hasattr(st.part, "kv"):
                return st.part.kv(cfg)
        raise ValueError("a block without an attention or linear-attention part has no cache")


def prenorm_block(mixer, ffn) -> BlockSpec:
    """x + mixer(attn_norm(x)), then x + ffn(ffn_norm(x)): llama's block and most others'."""
    return BlockSpec((Residual(mixer, "attn_norm"), Residual(ffn, "ffn_norm")))
