"""Qwen 3 MoE: Qwen 3 attention, and a softmax router picking top-k of E SiLU experts per token (dense MLPs on the
layers config.json lists in mlp_only_layers)."""
from __future__ import annotations

from engine.model.archs.qwen3 import Qwen3
from engine.model.registry import register
from engine.model.spec import GatedMLPSpec, MoESpec, prenorm_block


@register
class Qwen3Moe(Qwen3):
    name = "qwen3moe"
    hf_model_types = ("qwen3_moe",)
    dense_ffn = False

    def gguf_config(self, m, kw) -> None:
        kw.update(num_experts=m.num("expert_count", required=True),
                  num_experts_per_tok=m.num("expert_used_count", required=True),
                  moe_intermediate_size=m.num("expert_feed_forward_length", required=True),
                  norm_topk_prob=bool(m.get("expert_weights_norm", True)),
                  dense_layers=tuple(i for i in range(kw["num_layers"])
                                     if f"blk.{i}.ffn_gate_inp.weight" not in m.gf.tensors))

    def hf_config(self, cfg: dict, kw, need) -> None:
        n, step = kw["num_layers"], int(cfg.get("decoder_sparse_step") or 1)
        only = set(cfg.get("mlp_only_layers") or ())
        kw.update(num_experts=int(cfg.get("num_experts") or need("num_local_experts")),
                  num_experts_per_tok=int(need("num_experts_per_tok")),
                  moe_intermediate_size=int(need("moe_intermediate_size")),
                  norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                  dense_layers=tuple(i for i in range(n) if i in only or (i + 1) % step))

    def block(self, cfg, layer: int):
        if layer in cfg.dense_layers:
            ffn = GatedMLPSpec(cfg.hidden_act)
        else:
            ffn = MoESpec(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob)
        return prenorm_block(self.attention(cfg, layer), ffn)
