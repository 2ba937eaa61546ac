"""Gemma 4 (text): Gemma 3's sandwich blocks with plain RMSNorm weights, V normed without a weight, a score scale of
1, full-attention layers with their own head_dim and kv heads (and, with attention_k_eq_v, no attn_v: V is the raw
k projection) under proportional RoPE, the last layers reading the K/V of earlier ones, per-layer embeddings feeding
a gated projection step, a dense MLP beside a MoE (26B-A4B), and a scalar on each block's output."""
from __future__ import annotations

import re

import numpy as np

from cpu_kernels.rope import RopeScaling
from engine.errors import ModelLoadError
from engine.model.architecture import Architecture
from engine.model.registry import register
from engine.model.spec import (AttentionSpec, BlockSpec, GatedMLPSpec, MoESpec, ParallelFFNSpec, PerLayerEmbeddingSpec,
                               PerLayerInputSpec, Residual, RopeSpec)

ROPE_THETA_LOCAL = 10000.0
GLOBAL_HEAD_DIM = 512  # transformers' default global_head_dim
NO_ROTATION = 1e20     # llama.cpp's rope_freqs.weight holds 1e30 for the frequencies that do not turn
_HF_GLOBAL = {"model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
              "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
              "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight"}
_HF_LAYER = {"layer_scalar": "layer_output_scale.weight", "router.scale": "ffn_gate_inp.scale",
             "router.per_expert_scale": "ffn_down_exps.scale", "experts.gate_up_proj": "ffn_gate_up_exps.weight",
             "experts.down_proj": "ffn_down_exps.weight"}
_HF_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)$")


@register
class Gemma4(Architecture):
    name = "gemma4"
    hf_model_types = ("gemma4_text", "gemma4")
    embed_scale = True
    gguf_per_layer_keys = ("attention.head_count_kv", "feed_forward_length")
    hf_layer_map = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                    "post_feedforward_layernorm": "post_ffw_norm", "pre_feedforward_layernorm_2": "pre_ffw_norm_2",
                    "post_feedforward_layernorm_1": "post_ffw_norm_1",
                    "post_feedforward_layernorm_2": "post_ffw_norm_2", "router.proj": "ffn_gate_inp",
                    "per_layer_input_gate": "inp_gate", "per_layer_projection": "proj",
                    "post_per_layer_input_norm": "post_norm"}
    hf_tie_default = True
    hf_default_rope_theta = 1e6

    def hf_tensor(self, weights, hf_name: str, src, sources: dict) -> bool:
        """The tensors hf.LAYER_MAP cannot name: model-level PLE tensors, per-layer ones without .weight, and the
        experts' gate_up_proj kept stacked (E, 2I, H), as llama.cpp's converter writes ffn_gate_up_exps."""
        name = _HF_GLOBAL.get(hf_name)
        if name is None and (m := _HF_LAYER_RE.match(hf_name)) and m[2] in _HF_LAYER:
            name = f"blk.{m[1]}.{_HF_LAYER[m[2]]}"
        if name is None:
            return False
        dtype, a = weights.source_array(src)
        weights.add_tensor(name, weights.float_type(dtype, hf_name), a.shape, lambda a=a: a)
        return True

    # ------------------------------------------------------------------------------------------- config
    def gguf_config(self, m, kw) -> None:
        n, path = kw["num_layers"], m.gf.path
        swa = m.get("attention.sliding_window_pattern", required=True)
        window = m.num("attention.sliding_window", required=True)
        full = [not bool(s) for s in np.asarray(swa).reshape(-1)]
        if len(full) != n:
            raise ModelLoadError(f"{path}: attention.sliding_window_pattern has {len(full)} entries for {n} layers")
        heads_kv = _per_layer(m.get("attention.head_count_kv"), n, kw["num_kv_heads"])
        ffn = _per_layer(m.get("feed_forward_length"), n, kw["intermediate_size"])
        shared = m.num("attention.shared_kv_layers", 0)
        head_dim = m.num("attention.key_length_swa", required=True)
        if m.num("attention.value_length_swa", head_dim) != head_dim:
            raise ModelLoadError(f"{path}: value_length_swa != key_length_swa is not supported")
        if m.num("rope.dimension_count_swa", head_dim) != head_dim:
            raise ModelLoadError(f"{path}: partial RoPE on sliding layers (rope.dimension_count_swa) is not supported")
        g = kw["head_dim"]  # key_length: the full layers' head_dim
        if m.num("attention.value_length", g) != g or m.num("rope.dimension_count", g) != g:
            raise ModelLoadError(f"{path}: full layers with value_length or rope.dimension_count != key_length are "
                                 "not supported (llama.cpp's gemma4 turns partial RoPE into rope_freqs)")
        kinds = [{heads_kv[i] for i in range(n) if full[i] == f} for f in (False, True)]
        if len(kinds[0]) > 1 or len(kinds[1]) > 1:
            raise ModelLoadError(f"{path}: attention.head_count_kv {heads_kv} varies within a layer type")
        double = shared > 0 and ffn[-1] == 2 * ffn[0]
        if ffn != [ffn[0] * (2 if double and i >= n - shared else 1) for i in range(n)]:
            raise ModelLoadError(f"{path}: feed_forward_length {ffn} is neither one width nor the double-wide MLP "
                                 "of the KV-shared layers")
        kw.update(head_dim=head_dim, head_dim_global=g, num_kv_heads=min(kinds[0] or kinds[1]),
                  num_kv_heads_global=min(kinds[1], default=0), rope_dim=0,
                  rope_theta_local=m.num("rope.freq_base_swa", ROPE_THETA_LOCAL, kind=float),
                  layer_sliding_window=tuple(0 if f else window for f in full), kv_shared_layers=shared,
                  double_wide_mlp=double, per_layer_input_size=m.num("embedding_length_per_layer_input", 0),
                  attn_scale=1.0, intermediate_size=ffn[0], hidden_act="gelu_tanh",
                  attn_k_eq_v=any(full[i] and f"blk.{i}.attn_v.weight" not in m.gf.tensors for i in range(n - shared)),
                  rope_pairs_global=_turning_pairs(m.gf, g))
        if "blk.0.ffn_gate_inp.weight" in m.gf.tensors:
            kw.update(num_experts=m.num("expert_count", required=True),
                      num_experts_per_tok=m.num("expert_used_count", required=True),
                      moe_intermediate_size=m.num("expert_feed_forward_length", required=True))

    def hf_config(self, cfg: dict, kw, need) -> None:
        if cfg.get("use_bidirectional_attention") == "all":
            raise ModelLoadError("gemma4: use_bidirectional_attention 'all' (non-causal attention) is not supported")
        rope = cfg.get("rope_parameters") or {}
        local, full = rope.get("sliding_attention") or {}, rope.get("full_attention") or {}
        per_layer = {int(k): v for k, v in (cfg.get("per_layer_config") or {}).items()}
        full_cfg = per_layer[min(per_layer)] if per_layer else {}  # what every full layer overrides
        g = int(full_cfg.get("head_dim") or cfg.get("global_head_dim") or GLOBAL_HEAD_DIM)
        k_eq_v = bool(cfg.get("attention_k_eq_v", False))
        global_kv = full_cfg.get("num_key_value_heads") if per_layer else (
            cfg.get("num_global_key_value_heads") if k_eq_v else None)
        pairs = 0
        if full.get("rope_type") == "proportional":
            pairs = int(float(full.get("partial_rotary_factor", 1.0)) * g // 2)
        kw.update(rope_theta_local=float(local.get("rope_theta", ROPE_THETA_LOCAL)), head_dim_global=g,
                  num_kv_heads_global=int(global_kv or 0), rope_pairs_global=pairs if pairs < g // 2 else 0,
                  attn_k_eq_v=k_eq_v, kv_shared_layers=int(cfg.get("num_kv_shared_layers") or 0),
                  double_wide_mlp=bool(cfg.get("use_double_wide_mlp", False)),
                  per_layer_input_size=int(cfg.get("hidden_size_per_layer_input") or 0), attn_scale=1.0)
        if cfg.get("enable_moe_block"):
            kw.update(num_experts=int(need("num_experts")), num_experts_per_tok=int(need("top_k_experts")),
                      moe_intermediate_size=int(need("moe_intermediate_size")))

    def gguf_metadata(self, cfg) -> dict:
        n, full = cfg.num_layers, [cfg.sliding_window(i) == 0 for i in range(cfg.num_layers)]
        g = cfg.head_dim_global or cfg.head_dim
        md = {"attention.key_length": g, "attention.value_length": g, "attention.key_length_swa": cfg.head_dim,
              "attention.value_length_swa": cfg.head_dim, "rope.dimension_count": g,
              "rope.dimension_count_swa": cfg.head_dim, "rope.freq_base_swa": float(cfg.rope_theta_local),
              "attention.sliding_window_pattern": [not f for f in full],
              "attention.shared_kv_layers": cfg.kv_shared_layers,
              "embedding_length_per_layer_input": cfg.per_layer_input_size}
        if cfg.num_kv_heads_global:
            md["attention.head_count_kv"] = [cfg.num_kv_heads_global if f else cfg.num_kv_heads for f in full]
        if cfg.double_wide_mlp:
            md["feed_forward_length"] = [self.mlp_width(cfg, i) for i in range(n)]
        if cfg.num_experts:  # llama.cpp's gemma4 reads no gating or norm keys: softmax, renormalized
            md.update(expert_count=cfg.num_experts, expert_used_count=cfg.num_experts_per_tok,
                      expert_feed_forward_length=cfg.moe_intermediate_size)
        return md

    # ------------------------------------------------------------------------------------------- layers
    def block(self, cfg, layer: int) -> BlockSpec:
        window = cfg.sliding_window(layer)
        if window:
            rope = RopeSpec(cfg.rope_theta_local or cfg.rope_theta, RopeScaling(), neox=True)
            head_dim, kv_heads = cfg.head_dim, cfg.num_kv_heads
        else:  # proportional RoPE: frequencies over the whole head, only the first rope_pairs_global turn
            rope = RopeSpec(cfg.rope_theta, cfg.rope_scaling, neox=True, pairs=cfg.rope_pairs_global)
            head_dim, kv_heads = cfg.head_dim_global or cfg.head_dim, cfg.num_kv_heads_global or cfg.num_kv_heads
        attn = AttentionSpec(rope, qk_norm=True, sliding_window=window, scale=1.0, head_dim=head_dim,
                             num_kv_heads=kv_heads, k_eq_v=cfg.attn_k_eq_v and not window, v_norm=True,
                             kv_from=kv_source(cfg, layer))
        mlp = GatedMLPSpec(cfg.hidden_act, self.mlp_width(cfg, layer))
        steps = [Residual(attn, "attn_norm", "post_attention_norm")]
        if cfg.num_experts:
            moe = MoESpec(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, True, cfg.hidden_act,
                          router_input_norm=True, expert_scale=True, gate_up=True)
            steps.append(Residual(ParallelFFNSpec(mlp, moe), None, "post_ffw_norm"))
        else:
            steps.append(Residual(mlp, "ffn_norm", "post_ffw_norm"))
        if cfg.per_layer_input_size:
            steps.append(Residual(PerLayerInputSpec(cfg.per_layer_input_size, layer), None, "post_norm"))
        return BlockSpec(tuple(steps), out_scale="layer_output_scale.weight")

    @staticmethod
    def mlp_width(cfg, layer: int) -> int:
        """The dense MLP's width: twice intermediate_size on the KV-shared layers with use_double_wide_mlp."""
        shared = layer >= cfg.num_layers - cfg.kv_shared_layers
        return cfg.intermediate_size * (2 if cfg.double_wide_mlp and shared else 1)

    def gguf_tensors(self, cfg) -> dict[str, np.ndarray]:
        if not any(cfg.sliding_window(i) == 0 for i in range(cfg.num_layers)):
            return {}
        return {"rope_freqs.weight": rope_freqs(cfg)}

    def per_layer_embedding(self, cfg):
        return PerLayerEmbeddingSpec(cfg.per_layer_input_size, cfg.num_layers) if cfg.per_layer_input_size else None

    def model_tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        out = super().model_tensors(cfg)
        if any(cfg.sliding_window(i) == 0 for i in range(cfg.num_layers)):
            out["rope_freqs.weight"] = ((cfg.head_dim_global or cfg.head_dim) // 2,)  # full layers' proportional RoPE
        return out


def kv_source(cfg, layer: int) -> int:
    """The layer whose K/V a KV-shared layer reads (the last one before the shared layers of the same kind, as
    transformers' kv_sharing_modes), or -1 for a layer with its own."""
    first = cfg.num_layers - cfg.kv_shared_layers
    if layer < first:
        return -1
    full = cfg.sliding_window(layer) == 0
    src = next((i for i in range(first - 1, -1, -1) if (cfg.sliding_window(i) == 0) == full), -1)
    if src < 0:
        raise ModelLoadError(f"gemma4: KV-shared layer {layer} has no earlier {'full' if full else 'sliding'} layer")
    return src


def rope_freqs(cfg) -> np.ndarray:
    """llama.cpp's rope_freqs.weight for the full layers: 1 where a frequency turns, 1e30 where it does not."""
    half = (cfg.head_dim_global or cfg.head_dim) // 2
    pairs = cfg.rope_pairs_global or half
    return np.array([1.0] * pairs + [1e30] * (half - pairs), np.float32)


def _per_layer(value, n: int, default: int) -> list[int]:
    """A GGUF value that is one number or one per layer, as a list of n ints."""
    if value is None:
        return [int(default)] * n
    a = np.asarray(value).reshape(-1)
    return [int(a[0])] * n if a.size == 1 else [int(v) for v in a]


def _turning_pairs(gf, head_dim: int) -> int:
    """How many frequencies of the full layers turn: the leading 1s of rope_freqs.weight (0 = all, no tensor)."""
    if "rope_freqs.weight" not in gf.tensors:
        return 0
    f = np.asarray(gf.raw("rope_freqs.weight"), np.float32).reshape(-1)
    turning = int(np.argmax(f >= NO_ROTATION)) if (f >= NO_ROTATION).any() else f.size
    if f.size != head_dim // 2 or not np.all(f[:turning] == 1.0) or not np.all(f[turning:] >= NO_ROTATION):
        raise ModelLoadError(f"{gf.path}: rope_freqs.weight is not proportional RoPE's 1s then 1e30s")
    return turning if turning < f.size else 0
