"""Llama 2/3, Mistral, TinyLlama: pre-norm blocks, SiLU gated MLP, RoPE on llama.cpp-permuted Q/K."""
from __future__ import annotations

from engine.model.architecture import Architecture
from engine.model.registry import register
from engine.model.spec import AttentionSpec, GatedMLPSpec, RopeSpec, prenorm_block


@register
class Llama(Architecture):
    name = "llama"
    hf_model_types = ("llama", "mistral")
    rope_neox = False
    hf_permute_qk = True
    qkv_bias = False
    qk_norm = False

    def attention(self, cfg, layer: int) -> AttentionSpec:
        return AttentionSpec(RopeSpec(cfg.rope_theta, cfg.rope_scaling, self.rope_neox, freqs_tensor=True),
                             qkv_bias=self.qkv_bias, qk_norm=self.qk_norm, sliding_window=cfg.sliding_window(layer),
                             softcap=cfg.attn_logit_softcap, scale=cfg.attn_scale)

    def block(self, cfg, layer: int):
        return prenorm_block(self.attention(cfg, layer), GatedMLPSpec(cfg.hidden_act))
