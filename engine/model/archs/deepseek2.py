"""DeepSeek-V3 / R1 / V3.1 and the smaller models of that shape (GGUF deepseek2, HF deepseek_v3): pre-norm blocks of
multi-head latent attention (parts/mla.py: the cache holds a latent and one roped key per token) and, after the first
dense layers, a sigmoid-routed MoE with the correction bias, group-limited top-k, routed scaling and shared experts.

GGUF keys and tensors as llama.cpp reads them: head_count_kv 1 and key_length/value_length describe the cache
(kv_lora_rank + rope dims, kv_lora_rank), key_length_mla/value_length_mla the real heads; legacy files without the
*_mla keys hold the unsplit attn_kv_b, which parts/mla.py splits at load as llama.cpp's converter does for HF folders.
"""
from __future__ import annotations

import math
from dataclasses import replace

from engine.errors import ModelLoadError
from engine.model.architecture import Architecture
from engine.model.archs import deepseek_moe
from engine.model.parts.mla import split_kv_b
from engine.model.registry import register
from engine.model.config import RopeScaling
from engine.model.spec import BlockSpec, MLASpec, Residual, RopeSpec


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _unit_rope(sc: RopeScaling) -> RopeScaling:
    """YaRN without its cos/sin multiplier: llama.cpp's deepseek2 graph cancels it (the mscale goes into the softmax
    scale instead), as HF's attention_factor mscale/mscale_all_dim does when both are equal (DeepSeek's configs)."""
    return replace(sc, attn_factor=1.0 / _yarn_mscale(sc.factor)) if sc.type == "yarn" else sc


@register
class Deepseek2(Architecture):
    name = "deepseek2"
    hf_model_types = ("deepseek_v3",)
    rope_neox = False  # llama.cpp's NORM rope on the rope dims: pairs (2i, 2i + 1), as HF's rope_interleave
    dense_ffn = False

    def gguf_config(self, m, kw) -> None:
        path = m.gf.path
        kv_lora = m.num("attention.kv_lora_rank", required=True)
        rope_dim = kw["rope_dim"] or kw["head_dim"]
        key_len, value_len = kw["head_dim"], m.num("attention.value_length", kw["head_dim"])
        if m.get("attention.key_length_mla") is not None:  # MLA files: key/value_length are the cache's
            if (key_len, value_len) != (kv_lora + rope_dim, kv_lora):
                raise ModelLoadError(f"{path}: key_length {key_len} / value_length {value_len} are not the latent "
                                     f"cache of kv_lora_rank {kv_lora} + rope {rope_dim}")
            head_dim = m.num("attention.key_length_mla", required=True)
            value_dim = m.num("attention.value_length_mla", required=True)
        else:  # legacy files: the real heads, and attn_kv_b
            head_dim, value_dim = key_len, value_len
        if not 0 < rope_dim < head_dim:
            raise ModelLoadError(f"{path}: rope dims {rope_dim} do not fit the {head_dim}-dim query heads")
        nextn = m.num("nextn_predict_layers", 0)
        kw["num_layers"] -= nextn  # block_count counts the MTP layers too
        kw.update(num_kv_heads=1, head_dim=head_dim, value_head_dim=value_dim, rope_dim=rope_dim,
                  q_lora_rank=m.num("attention.q_lora_rank", 0), kv_lora_rank=kv_lora,
                  rope_scaling=_unit_rope(kw["rope_scaling"]), nextn_layers=nextn,
                  rope_yarn_log_mul=m.num("rope.scaling.yarn_log_multiplier", 0.0, kind=float),
                  # absent gating: softmax, llama.cpp's reading of DeepSeek-V2 files
                  **deepseek_moe.gguf_fields(m, default_gating=1),
                  expert_selection_bias=any(n.endswith(".exp_probs_b.bias") for n in m.gf.tensors))

    def hf_config(self, cfg: dict, kw, need) -> None:
        if cfg.get("attention_bias"):
            raise ModelLoadError("deepseek_v3 with attention_bias is not supported (llama.cpp's deepseek2 has no "
                                 "attention biases)")
        if cfg.get("rope_interleave") is False:
            raise ModelLoadError("deepseek_v3 with rope_interleave false is not supported (llama.cpp's deepseek2 "
                                 "turns interleaved pairs)")
        rope, nope = int(need("qk_rope_head_dim")), int(need("qk_nope_head_dim"))
        params = cfg.get("rope_parameters") or {}  # where hf_config._rope found the scaling
        if params.get("rope_type", "default") in (None, "default"):
            params = cfg.get("rope_scaling") or {}
        mscale_all_dim = float(params.get("mscale_all_dim") or 0.0) if kw["rope_scaling"].type != "none" else 0.0
        kw.update(num_kv_heads=1, head_dim=nope + rope, rope_dim=rope, value_head_dim=int(need("v_head_dim")),
                  q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=int(need("kv_lora_rank")),
                  rope_yarn_log_mul=0.1 * mscale_all_dim, **deepseek_moe.hf_fields(cfg, need),
                  expert_selection_bias=True)

    def hf_split(self, cfg, suffix: str):
        # kv_b_proj -> attn_k_b / attn_v_b, as llama.cpp's converter splits it
        if suffix != "self_attn.kv_b_proj.weight":
            return None
        nh, nope, v, lat = cfg.num_heads, cfg.head_dim - cfg.rope_dim, cfg.value_head_dim, cfg.kv_lora_rank
        return {"attn_k_b.weight": ((nh, lat, nope), lambda w: split_kv_b(w, nh, nope, v)[0]),
                "attn_v_b.weight": ((nh, v, lat), lambda w: split_kv_b(w, nh, nope, v)[1])}

    hf_layer_map = {"self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm",
                    "self_attn.q_b_proj": "attn_q_b", "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
                    "self_attn.kv_a_layernorm": "attn_kv_a_norm"}

    def gguf_metadata(self, cfg) -> dict:
        out = {"attention.key_length": cfg.kv_lora_rank + cfg.rope_dim, "attention.value_length": cfg.kv_lora_rank,
               "attention.key_length_mla": cfg.head_dim, "attention.value_length_mla": cfg.value_head_dim,
               # 0 for the plain attn_q: llama.cpp reads the key unless the layer count marks a known lite model
               "attention.q_lora_rank": cfg.q_lora_rank, "attention.kv_lora_rank": cfg.kv_lora_rank,
               "leading_dense_block_count": len(cfg.dense_layers), "expert_shared_count": cfg.expert_shared_count,
               "expert_weights_scale": float(cfg.expert_weights_scale),
               "expert_gating_func": deepseek_moe.GATING_CODE[cfg.expert_gating]}
        if cfg.rope_yarn_log_mul:
            out["rope.scaling.yarn_log_multiplier"] = float(cfg.rope_yarn_log_mul)
        return out

    def block(self, cfg, layer: int):
        rope = RopeSpec(cfg.rope_theta, cfg.rope_scaling, neox=False, dim=cfg.rope_dim)
        mscale = 1.0 + cfg.rope_yarn_log_mul * math.log(cfg.rope_scaling.factor) \
            if cfg.rope_scaling.type != "none" and cfg.rope_scaling.factor > 1 else 1.0
        attn = MLASpec(rope, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.value_head_dim or cfg.head_dim,
                       mscale * mscale / math.sqrt(cfg.head_dim))
        ffn = deepseek_moe.ffn(cfg, layer, selection_bias=cfg.expert_selection_bias)
        return BlockSpec((Residual(attn, "attn_norm"), Residual(ffn, "ffn_norm")))
