"""DeepSeek's routed MoE, as deepseek2 and glm4moe share it: the first layers dense, then routed experts scored by
softmax or sigmoid (with the correction bias), group-limited top-k, a routed scaling factor and shared experts. Its
GGUF keys and HF config fields are read here once."""
from __future__ import annotations

from engine.errors import ModelLoadError
from engine.model.spec import GatedMLPSpec, MoESpec

GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's expert_gating_func
GATING_CODE = {v: k for k, v in GATING.items()}


def gguf_fields(m, default_gating: int) -> dict:
    """The config fields from a GGUF file's metadata (default_gating: the value a file without the key means)."""
    gating = m.num("expert_gating_func", default_gating)
    if gating not in GATING:
        raise ModelLoadError(f"{m.gf.path}: expert_gating_func {gating} is not supported (1 softmax, 2 sigmoid)")
    return dict(num_experts=m.num("expert_count", required=True),
                num_experts_per_tok=m.num("expert_used_count", required=True),
                moe_intermediate_size=m.num("expert_feed_forward_length", required=True),
                expert_shared_count=m.num("expert_shared_count", 0),
                expert_group_count=m.num("expert_group_count", 1),
                expert_group_used_count=m.num("expert_group_used_count", 1),
                expert_weights_scale=m.num("expert_weights_scale", 1.0, kind=float) or 1.0,
                norm_topk_prob=bool(m.get("expert_weights_norm", False)), expert_gating=GATING[gating],
                dense_layers=tuple(range(m.num("leading_dense_block_count", 0))))


def hf_fields(cfg: dict, need) -> dict:
    """The config fields from an HF config (deepseek_v3 and glm4_moe name them alike; both score by sigmoid)."""
    return dict(num_experts=int(need("n_routed_experts")), num_experts_per_tok=int(need("num_experts_per_tok")),
                moe_intermediate_size=int(need("moe_intermediate_size")),
                expert_shared_count=int(cfg.get("n_shared_experts") or 0),
                expert_group_count=int(cfg.get("n_group") or 1),
                expert_group_used_count=int(cfg.get("topk_group") or 1),
                expert_weights_scale=float(cfg.get("routed_scaling_factor") or 1.0),
                norm_topk_prob=bool(cfg.get("norm_topk_prob", True)), expert_gating="sigmoid",
                dense_layers=tuple(range(int(cfg.get("first_k_dense_replace") or 0))))


def ffn(cfg, layer: int, selection_bias: bool):
    """The layer's feed-forward part: a dense MLP in the first layers, else the routed experts and shared ones."""
    if layer in cfg.dense_layers:
        return GatedMLPSpec(cfg.hidden_act)
    width = cfg.moe_intermediate_size
    shared = GatedMLPSpec(cfg.hidden_act, width * cfg.expert_shared_count, suffix="_shexp") \
        if cfg.expert_shared_count else None
    return MoESpec(cfg.num_experts, cfg.num_experts_per_tok, width, cfg.norm_topk_prob, scoring=cfg.expert_gating,
                   selection_bias=selection_bias, n_group=cfg.expert_group_count,
                   topk_group=cfg.expert_group_used_count, routed_scale=cfg.expert_weights_scale, shared=shared)
