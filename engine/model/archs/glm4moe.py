"""GLM-4.5 / 4.6 / Air (glm4moe): pre-norm blocks with partial NeoX RoPE (half the head), optional QK-norm and qkv
biases; the first layers dense, the rest sigmoid-routed MoE with DeepSeek's correction bias and a shared expert.
The MTP layer the checkpoints carry after the main ones is kept in the file, not run."""
from __future__ import annotations

from engine.model.architecture import Architecture
from engine.model.registry import register
from engine.model.spec import AttentionSpec, BlockSpec, GatedMLPSpec, MoESpec, Residual, RopeSpec

GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's expert_gating_func


@register
class Glm4Moe(Architecture):
    name = "glm4moe"
    hf_model_types = ("glm4_moe",)
    dense_ffn = False
    hf_layer_map = {"post_attention_layernorm": "post_attention_norm"}

    def gguf_config(self, m, kw) -> None:
        nextn = m.num("nextn_predict_layers", 0)
        kw["num_layers"] -= nextn  # block_count counts the MTP layers too
        kw.update(nextn_layers=nextn, num_experts=m.num("expert_count", required=True),
                  num_experts_per_tok=m.num("expert_used_count", required=True),
                  moe_intermediate_size=m.num("expert_feed_forward_length", required=True),
                  expert_shared_count=m.num("expert_shared_count", 0),
                  expert_group_count=m.num("expert_group_count", 1),
                  expert_group_used_count=m.num("expert_group_used_count", 1),
                  expert_weights_scale=m.num("expert_weights_scale", 1.0, kind=float) or 1.0,
                  norm_topk_prob=bool(m.get("expert_weights_norm", False)),
                  expert_gating=GATING[m.num("expert_gating_func", 2)],
                  dense_layers=tuple(range(m.num("leading_dense_block_count", 0))),
                  attn_bias="blk.0.attn_q.bias" in m.gf.tensors, qk_norm="blk.0.attn_q_norm.weight" in m.gf.tensors)

    def hf_config(self, cfg: dict, kw, need) -> None:
        head_dim = kw["head_dim"]
        kw.update(nextn_layers=int(cfg.get("num_nextn_predict_layers") or 0),
                  num_experts=int(need("n_routed_experts")), num_experts_per_tok=int(need("num_experts_per_tok")),
                  moe_intermediate_size=int(need("moe_intermediate_size")),
                  expert_shared_count=int(cfg.get("n_shared_experts") or 0),
                  expert_group_count=int(cfg.get("n_group") or 1), expert_group_used_count=int(cfg.get("topk_group") or 1),
                  expert_weights_scale=float(cfg.get("routed_scaling_factor") or 1.0),
                  norm_topk_prob=bool(cfg.get("norm_topk_prob", True)), expert_gating="sigmoid",
                  dense_layers=tuple(range(int(cfg.get("first_k_dense_replace") or 0))),
                  rope_dim=int(head_dim * float(cfg.get("partial_rotary_factor") or 0.5)),
                  attn_bias=bool(cfg.get("attention_bias", False)), qk_norm=bool(cfg.get("use_qk_norm", False)))

    def block(self, cfg, layer: int):
        rope = RopeSpec(cfg.rope_theta, cfg.rope_scaling, neox=True, dim=cfg.rope_dim)
        attn = AttentionSpec(rope, qkv_bias=cfg.attn_bias, qk_norm=cfg.qk_norm)
        if layer in cfg.dense_layers:
            ffn = GatedMLPSpec(cfg.hidden_act)
        else:
            width = cfg.moe_intermediate_size
            shared = GatedMLPSpec(cfg.hidden_act, width * cfg.expert_shared_count, suffix="_shexp") \
                if cfg.expert_shared_count else None
            ffn = MoESpec(cfg.num_experts, cfg.num_experts_per_tok, width, cfg.norm_topk_prob,
                          scoring=cfg.expert_gating, selection_bias=True, n_group=cfg.expert_group_count,
                          topk_group=cfg.expert_group_used_count, routed_scale=cfg.expert_weights_scale, shared=shared)
        return BlockSpec((Residual(attn, "attn_norm"), Residual(ffn, "post_attention_norm")))
