"""Qwen3.5 / 3.6 dense (qwen35) and MoE (qwen35moe): three of every four layers Gated DeltaNet linear attention (a
per-sequence conv + recurrent state instead of KV), the fourth gated full attention (q_proj yields [q_h | gate_h],
sigmoid(gate) on the output, QK-norm, NeoX RoPE on the first quarter of each head, theta 1e7); a SwiGLU MLP or,
in qwen35moe, a softmax top-k MoE (always renormalised) plus a shared expert scaled by sigmoid(ffn_gate_inp_shexp.x).

Conventions (GGUF's, which HF folders are converted to at load as llama.cpp's converter does):
- value heads in the tiled order: value head h reads key head h % Hk (HF groups them: h // (Hv / Hk)), so the V
  rows of in_proj_qkv and conv1d, z, b, a, A_log, dt_bias and out_proj's columns are reordered;
- RMSNorm weights hold 1 + w (HF stores w), except the DeltaNet's gated norm (ssm_norm), plain in both;
- ssm_a = -exp(A_log); ssm_conv1d is (C, K).
HF checkpoints nesting text_config (qwen3_5, qwen3_5_moe) load their text model; the vision tower is skipped (hf.py
logs what). The MTP layer (mtp.*, GGUF blk.{L}.nextn.*) is counted in nextn_layers; speculative decoding's "mtp"
method runs it (engine/spec_decode/mtp.py).
M-RoPE reduces to 1-D RoPE for text (all three position axes equal), so its sections are only written to GGUF.
"""
from __future__ import annotations

import numpy as np

from engine.model.architecture import Architecture
from engine.model.registry import register
from engine.model.spec import (AttentionSpec, BlockSpec, GatedDeltaNetSpec, GatedMLPSpec, MoESpec, Residual,
                               RopeSpec)

MROPE_SECTIONS = (11, 11, 10, 0)  # llama.cpp requires rope.dimension_sections; text positions make it plain RoPE
_MTP = {"fc.": "eh_proj.", "pre_fc_norm_embedding.": "enorm.", "pre_fc_norm_hidden.": "hnorm.",
        "norm.": "shared_head.norm."}


@register
class Qwen35(Architecture):
    name = "qwen35"
    hf_model_types = ("qwen3_5", "qwen3_5_text")
    hf_norm_offset = 1.0
    hf_plain_norms = ("ssm_norm",)
    hf_default_rope_theta = 1e7
    hf_layer_map = {
        "post_attention_layernorm": "post_attention_norm",
        "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
        "linear_attn.in_proj_b": "ssm_beta", "linear_attn.in_proj_a": "ssm_alpha",
        "linear_attn.conv1d": "ssm_conv1d", "linear_attn.norm": "ssm_norm", "linear_attn.out_proj": "ssm_out",
    }
    hf_special_map = {"linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias"}

    # ---- hyperparameters
    def gguf_config(self, m, kw) -> None:
        nextn = m.num("nextn_predict_layers", 0)
        kw["num_layers"] -= nextn  # block_count counts the MTP layers too
        n, interval = kw["num_layers"], m.num("full_attention_interval", 4)
        recurrent = m.get("attention.recurrent_layers")  # optional per-layer flags (llama.cpp reads them first)
        if recurrent is not None:
            linear = tuple(i for i in range(n) if bool(recurrent[i]))
        else:
            linear = tuple(i for i in range(n) if (i + 1) % interval)
        v_heads = m.num("ssm.time_step_rank", required=True)
        kw.update(nextn_layers=nextn, linear_layers=linear, ssm_conv_kernel=m.num("ssm.conv_kernel", required=True),
                  ssm_num_k_heads=m.num("ssm.group_count", required=True), ssm_num_v_heads=v_heads,
                  ssm_k_head_dim=m.num("ssm.state_size", required=True),
                  ssm_v_head_dim=m.num("ssm.inner_size", required=True) // v_heads, qk_norm=True)

    def hf_config(self, cfg: dict, kw, need) -> None:
        n = kw["num_layers"]
        types = cfg.get("layer_types")
        if not types:
            interval = int(cfg.get("full_attention_interval") or 4)
            types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
        params = cfg.get("rope_parameters") or {}
        prf = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
        kw.update(linear_layers=tuple(i for i, t in enumerate(types[:n]) if t == "linear_attention"),
                  ssm_conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4),
                  ssm_num_k_heads=int(cfg.get("linear_num_key_heads") or 16),
                  ssm_num_v_heads=int(cfg.get("linear_num_value_heads") or 32),
                  ssm_k_head_dim=int(cfg.get("linear_key_head_dim") or 128),
                  ssm_v_head_dim=int(cfg.get("linear_value_head_dim") or 128),
                  rope_dim=int(kw["head_dim"] * prf), qk_norm=True, attn_bias=bool(cfg.get("attention_bias", False)))

    def gguf_metadata(self, cfg) -> dict:
        out = {"ssm.conv_kernel": cfg.ssm_conv_kernel, "ssm.state_size": cfg.ssm_k_head_dim,
               "ssm.group_count": cfg.ssm_num_k_heads, "ssm.time_step_rank": cfg.ssm_num_v_heads,
               "ssm.inner_size": cfg.ssm_num_v_heads * cfg.ssm_v_head_dim,
               "rope.dimension_sections": list(MROPE_SECTIONS)}
        interval = _interval(cfg)
        if interval:
            out["full_attention_interval"] = interval
        else:  # not every interval-th layer: the per-layer flags llama.cpp also reads
            out["attention.recurrent_layers"] = [i in cfg.linear_layers for i in range(cfg.num_layers)]
        return out

    # ---- HF tensors
    def hf_rename(self, name: str, cfg) -> str:
        if not name.startswith("mtp."):
            return name
        rest, n = name[4:], cfg.num_layers
        if rest.startswith("layers."):
            idx, tail = rest[7:].split(".", 1)
            return f"model.layers.{n + int(idx)}.{tail}"
        for old, new in _MTP.items():
            if rest.startswith(old):
                return f"model.layers.{n}.{new}{rest[len(old):]}"
        return name

    def hf_transform(self, name: str, shape: tuple[int, ...], cfg):
        parts = name.split(".")
        if len(parts) < 3 or not parts[1].isdigit() or int(parts[1]) not in cfg.linear_layers:
            return None
        base = ".".join(parts[2:])
        Hk, Hv, dk, dv = cfg.ssm_num_k_heads, cfg.ssm_num_v_heads, cfg.ssm_k_head_dim, cfg.ssm_v_head_dim
        key_dim = 2 * Hk * dk  # q and k rows/channels before the v ones

        def tiled(a, axis, hdim, start=0):
            return _tile_v_heads(a, axis, Hk, Hv // Hk, hdim, start)
        if base in ("attn_qkv.weight",):
            return shape, lambda a: tiled(a, 0, dv, key_dim)
        if base == "attn_gate.weight":
            return shape, lambda a: tiled(a, 0, dv)
        if base in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_dt.bias"):
            return shape, lambda a: tiled(a, 0, 1)
        if base == "ssm_a":
            return shape, lambda a: tiled(-np.exp(a), 0, 1)
        if base == "ssm_conv1d.weight":  # (C, 1, K) -> (C, K)
            flat = (shape[0], shape[-1])
            return flat, lambda a: tiled(a.reshape(flat), 0, dv, key_dim)
        if base == "ssm_out.weight":
            return shape, lambda a: tiled(a, 1, dv)
        return None

    def hf_transform_rows(self, name: str, shape: tuple[int, ...], cfg, block: int):
        # the value-head reorders move whole rows, and ssm_out's move column runs of dv: whole blocks when block | dv
        if self.hf_transform(name, shape, cfg) is None or name.endswith(("ssm_a", "ssm_conv1d.weight", ".bias")):
            return None
        base = ".".join(name.split(".")[2:])
        Hk, Hv, dk, dv = cfg.ssm_num_k_heads, cfg.ssm_num_v_heads, cfg.ssm_k_head_dim, cfg.ssm_v_head_dim
        if base == "ssm_out.weight":
            if dv % block:
                return None
            return lambda r: _tile_v_heads(r.reshape(r.shape[0], shape[1] // block, -1), 1, Hk, Hv // Hk,
                                           dv // block).reshape(r.shape)
        start, hdim = {"attn_qkv.weight": (2 * Hk * dk, dv), "attn_gate.weight": (0, dv)}.get(base, (0, 1))
        return lambda r: _tile_v_heads(r, 0, Hk, Hv // Hk, hdim, start)

    # ---- layers
    def mixer(self, cfg, layer: int):
        if layer in cfg.linear_layers:
            return GatedDeltaNetSpec(cfg.ssm_num_k_heads, cfg.ssm_num_v_heads, cfg.ssm_k_head_dim, cfg.ssm_v_head_dim,
                                     cfg.ssm_conv_kernel)
        rope = RopeSpec(cfg.rope_theta, cfg.rope_scaling, neox=True, dim=cfg.rope_dim)
        return AttentionSpec(rope, qkv_bias=cfg.attn_bias, qk_norm=True, output_gate=True)

    def ffn(self, cfg, layer: int):
        return GatedMLPSpec(cfg.hidden_act)

    def block(self, cfg, layer: int) -> BlockSpec:
        return BlockSpec((Residual(self.mixer(cfg, layer), "attn_norm"),
                          Residual(self.ffn(cfg, layer), "post_attention_norm")))


@register
class Qwen35Moe(Qwen35):
    name = "qwen35moe"
    hf_model_types = ("qwen3_5_moe", "qwen3_5_moe_text")
    dense_ffn = False

    def gguf_config(self, m, kw) -> None:
        super().gguf_config(m, kw)
        kw.update(num_experts=m.num("expert_count", required=True),
                  num_experts_per_tok=m.num("expert_used_count", required=True),
                  moe_intermediate_size=m.num("expert_feed_forward_length", required=True),
                  shared_expert_intermediate_size=m.num("expert_shared_feed_forward_length", 0), norm_topk_prob=True)

    def hf_config(self, cfg: dict, kw, need) -> None:
        super().hf_config(cfg, kw, need)
        kw.update(num_experts=int(need("num_experts")), num_experts_per_tok=int(need("num_experts_per_tok")),
                  moe_intermediate_size=int(need("moe_intermediate_size")),
                  shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
                  norm_topk_prob=True)  # Qwen3.5's router always renormalises (the config has no switch)

    def gguf_metadata(self, cfg) -> dict:
        out = super().gguf_metadata(cfg)
        if cfg.shared_expert_intermediate_size:
            out["expert_shared_feed_forward_length"] = cfg.shared_expert_intermediate_size
        return out

    def ffn(self, cfg, layer: int):
        width = cfg.shared_expert_intermediate_size
        shared = GatedMLPSpec(cfg.hidden_act, width, suffix="_shexp") if width else None
        return MoESpec(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, True, shared=shared,
                       shared_gate=shared is not None)


def _interval(cfg) -> int:
    """The full-attention interval that gives cfg.linear_layers (llama.cpp's rule), or 0 when none does."""
    n, linear = cfg.num_layers, set(cfg.linear_layers)
    for k in range(1, n + 1):
        if all(((i + 1) % k != 0) == (i in linear) for i in range(n)):
            return k
    return 0


def _tile_v_heads(a: np.ndarray, axis: int, Hk: int, r: int, hdim: int, start: int = 0) -> np.ndarray:
    """Value heads along `axis` from `start` on, from HF's grouped order (Hk, r, hdim) to GGUF's tiled (r, Hk, hdim):
    llama.cpp's _LinearAttentionVReorderBase."""
    a = np.array(a)  # a copy in a's dtype (float values, or a block type's rows)
    if r == 1:
        return a
    a = np.moveaxis(a, axis, 0)
    v = a[start:start + Hk * r * hdim]
    rest = v.shape[1:]
    a[start:start + Hk * r * hdim] = v.reshape(Hk, r, hdim, *rest).swapaxes(0, 1).reshape(v.shape)
    return np.ascontiguousarray(np.moveaxis(a, 0, axis))
