"""Gemma 3 (text): sandwich norms, QK-norm, GELU-tanh MLP, sliding-window layers with their own RoPE base."""
from __future__ import annotations

from dataclasses import replace

from engine.model.base import DecoderModel
from engine.model.config import RopeScaling
from engine.model.fused_block import FusedBlock
from engine.model.layers import Attention, GatedMLP, RMSNorm, add_and_norm, rope_tables
from engine.model.registry import register


class SandwichBlock:
    """Norms before and after both attention and MLP (GGUF norm weights already hold Gemma's +1)."""

    def __init__(self, attn, mlp, norms):
        self.attn, self.mlp = attn, mlp
        self.attn_norm, self.post_attn_norm, self.ffn_norm, self.post_ffn_norm = norms
        self._fused = FusedBlock(self, self.post_attn_norm, self.post_ffn_norm)

    def __call__(self, x, meta, kv):
        y = self._fused.run(x, meta, kv)  # a decode step: the whole block in one compiled call
        if y is not None:
            return y
        x, h = add_and_norm(x, self.attn(self.attn_norm(x), meta, kv), self.post_attn_norm, self.ffn_norm)
        return add_and_norm(x, self.mlp(h), self.post_ffn_norm, None)[0]


@register("gemma3")
class Gemma3Model(DecoderModel):
    embed_scale = True

    def build_block(self, ws, layer: int):
        cfg = self.config
        if not hasattr(self, "_rope_global"):
            self._rope_global = rope_tables(cfg, cfg.rope_theta, ws)
            # Local layers use their own base and no scaling, as in HF's rotary_emb_local.
            local_cfg = replace(cfg, rope_scaling=RopeScaling())
            self._rope_local = rope_tables(local_cfg, cfg.rope_theta_local or cfg.rope_theta)
        inv_freq, mscale = self._rope_local if cfg.sliding_window(layer) else self._rope_global
        attn = Attention(ws, cfg, layer, qk_norm=True, inv_freq=inv_freq, mscale=mscale,
                         batch_invariant=self.batch_invariant)
        mlp = GatedMLP(ws, f"blk.{layer}.", cfg.hidden_act, self.batch_invariant)
        p, eps = f"blk.{layer}.", cfg.rms_norm_eps
        norms = [RMSNorm(ws, p + n, eps) for n in
                 ("attn_norm.weight", "post_attention_norm.weight", "ffn_norm.weight", "post_ffw_norm.weight")]
        return SandwichBlock(attn, mlp, norms)
