"""Llama 2/3, Mistral, TinyLlama: pre-norm blocks, SiLU gated MLP, RoPE on llama.cpp-permuted Q/K."""
from __future__ import annotations

from engine.model.base import DecoderModel
from engine.model.fused_block import FusedBlock
from engine.model.layers import Attention, GatedMLP, RMSNorm, add_and_norm, rope_tables
from engine.model.registry import register


class PreNormBlock:
    """x + attn(norm(x)), then x + mlp(norm(x)): the block of llama, qwen2, qwen3 and qwen3moe."""

    def __init__(self, attn, mlp, attn_norm: RMSNorm, ffn_norm: RMSNorm):
        self.attn, self.mlp, self.attn_norm, self.ffn_norm = attn, mlp, attn_norm, ffn_norm
        self._fused = FusedBlock(self, None, None)

    def __call__(self, x, meta, kv):
        y = self._fused.run(x, meta, kv)  # a decode step: the whole block in one compiled call
        if y is not None:
            return y
        x, h = add_and_norm(x, self.attn(self.attn_norm(x), meta, kv), None, self.ffn_norm)
        return x + self.mlp(h)


@register("llama")
class LlamaModel(DecoderModel):
    qkv_bias = False
    qk_norm = False

    def build_mlp(self, ws, layer: int):
        return GatedMLP(ws, f"blk.{layer}.", self.config.hidden_act, self.batch_invariant)

    def build_block(self, ws, layer: int):
        cfg = self.config
        if not hasattr(self, "_rope"):
            self._rope = rope_tables(cfg, cfg.rope_theta, ws)
        inv_freq, mscale = self._rope
        attn = Attention(ws, cfg, layer, qkv_bias=self.qkv_bias, qk_norm=self.qk_norm,
                         inv_freq=inv_freq, mscale=mscale, batch_invariant=self.batch_invariant)
        p = f"blk.{layer}."
        return PreNormBlock(attn, self.build_mlp(ws, layer), RMSNorm(ws, p + "attn_norm.weight", cfg.rms_norm_eps),
                            RMSNorm(ws, p + "ffn_norm.weight", cfg.rms_norm_eps))
