"""GLM-4.5 / 4.6 / Air (glm4moe): pre-norm blocks with partial NeoX RoPE (half the head), optional QK-norm and qkv
biases; the first layers dense, the rest sigmoid-routed MoE with DeepSeek's correction bias and a shared expert.
The MTP layer the checkpoints carry after the main ones is kept; speculative decoding's "mtp" method runs it."""
from __future__ import annotations

from engine.model.architecture import Architecture
from engine.model.archs import deepseek_moe
from engine.model.registry import register
from engine.model.spec import AttentionSpec, BlockSpec, Residual, RopeSpec


@register
class Glm4Moe(Architecture):
    name = "glm4moe"
    hf_model_types = ("glm4_moe",)
    dense_ffn = False
    hf_layer_map = {"post_attention_layernorm": "post_attention_norm"}

    def gguf_config(self, m, kw) -> None:
        nextn = m.num("nextn_predict_layers", 0)
        kw["num_layers"] -= nextn  # block_count counts the MTP layers too
        kw.update(nextn_layers=nextn, **deepseek_moe.gguf_fields(m, default_gating=2),
                  attn_bias="blk.0.attn_q.bias" in m.gf.tensors, qk_norm="blk.0.attn_q_norm.weight" in m.gf.tensors)

    def hf_config(self, cfg: dict, kw, need) -> None:
        head_dim = kw["head_dim"]
        kw.update(nextn_layers=int(cfg.get("num_nextn_predict_layers") or 0), **deepseek_moe.hf_fields(cfg, need),
                  rope_dim=int(head_dim * float(cfg.get("partial_rotary_factor") or 0.5)),
                  attn_bias=bool(cfg.get("attention_bias", False)), qk_norm=bool(cfg.get("use_qk_norm", False)))

    def block(self, cfg, layer: int):
        rope = RopeSpec(cfg.rope_theta, cfg.rope_scaling, neox=True, dim=cfg.rope_dim)
        attn = AttentionSpec(rope, qkv_bias=cfg.attn_bias, qk_norm=cfg.qk_norm)
        ffn = deepseek_moe.ffn(cfg, layer, selection_bias=True)
        return BlockSpec((Residual(attn, "attn_norm"), Residual(ffn, "post_attention_norm")))
