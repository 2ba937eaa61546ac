"""gpt-oss (GGUF "gpt-oss", llama.cpp's LLM_ARCH_OPENAI_MOE; HF "gpt_oss"): pre-norm blocks whose attention has
q/k/v/o biases, a learned sink logit per head and YaRN NeoX RoPE, sliding-window (even layers) and full layers
alternating, and a MoE of biased experts with the clamped SwiGLU, routed by top-k over the router's (biased)
logits with a softmax over the chosen ones. HF checkpoints store the experts as MXFP4 blocks (read as GGUF MXFP4,
engine/model/mxfp4_hf.py) or, in float re-exports and transformers' own tiny models, as x @ W matrices whose gate
and up columns interleave."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
from gguf import GGMLQuantizationType as GT

from engine.errors import ModelLoadError
from engine.model.architecture import Architecture
from engine.model.mxfp4_hf import hf_to_gguf
from engine.model.registry import register
from engine.model.spec import AttentionSpec, BlockSpec, MoESpec, Residual, RopeSpec

SWA_PERIOD = 2  # llama.cpp set_swa_pattern(2): layer il slides iff il % 2 == 0 (HF layer_types alike)
SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}  # the constants cpu_kernels/activations.py's kernel has
_EXPERTS_RE = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?$")


@register
class GptOss(Architecture):
    name = "gpt-oss"
    hf_model_types = ("gpt_oss",)
    dense_ffn = False
    hf_layer_map = {"post_attention_layernorm": "post_attention_norm", "mlp.router": "ffn_gate_inp"}
    hf_default_rope_theta = 150000.0

    def gguf_config(self, m, kw) -> None:
        n = kw["num_layers"]
        window = m.num("attention.sliding_window", required=True)
        pattern = m.get("attention.sliding_window_pattern", SWA_PERIOD)
        if isinstance(pattern, np.ndarray):  # one flag per layer (newer converters)
            slides = [bool(v) for v in pattern.tolist()]
        else:  # llama.cpp's set_swa_pattern(n): il % n < n - 1 slides
            slides = [i % int(pattern) < int(pattern) - 1 for i in range(n)]
        if len(slides) != n:
            raise ModelLoadError(f"{m.gf.path}: sliding_window_pattern has {len(slides)} entries for {n} layers")
        rs = kw["rope_scaling"]
        kw.update(num_experts=m.num("expert_count", required=True),
                  num_experts_per_tok=m.num("expert_used_count", required=True),
                  moe_intermediate_size=m.num("expert_feed_forward_length", required=True),
                  norm_topk_prob=False, expert_gating="topk_softmax",
                  layer_sliding_window=tuple(window if s else 0 for s in slides),
                  rope_theta_local=m.num("rope.freq_base_swa", 0.0, kind=float),
                  # gpt-oss's YaRN keeps the correction range unrounded (HF truncate=False; llama.cpp rounds it)
                  rope_scaling=replace(rs, truncate=False) if rs.type == "yarn" else rs,
                  attn_bias="blk.0.attn_q.bias" in m.gf.tensors,
                  attn_out_bias="blk.0.attn_output.bias" in m.gf.tensors)

    def hf_config(self, cfg: dict, kw, need) -> None:
        for key, value in SWIGLU.items():
            if float(cfg.get(key, value)) != value:
                raise ModelLoadError(f"config.json: {key} {cfg[key]} is not supported (only gpt-oss's {value})")
        qc = cfg.get("quantization_config") or {}
        if qc and qc.get("quant_method") != "mxfp4":
            raise ModelLoadError(f"config.json: quantization_config {qc.get('quant_method')!r} is not supported "
                                 "for gpt_oss (mxfp4, or none)")
        bias = bool(cfg.get("attention_bias", True))
        kw.update(num_experts=int(cfg.get("num_local_experts") or need("num_experts")),
                  num_experts_per_tok=int(need("num_experts_per_tok")),
                  moe_intermediate_size=int(need("intermediate_size")),
                  norm_topk_prob=False, expert_gating="topk_softmax", attn_bias=bias, attn_out_bias=bias)

    def hf_layer_windows(self, cfg: dict, num_layers: int) -> tuple[int, ...]:
        window = int(cfg.get("sliding_window") or 0)
        return tuple(window if i % SWA_PERIOD == 0 else 0 for i in range(num_layers)) if window > 0 else ()

    def gguf_metadata(self, cfg) -> dict:
        windows = cfg.layer_sliding_window
        if windows and any(bool(w) != (i % SWA_PERIOD == 0) for i, w in enumerate(windows)):
            raise ValueError("gpt-oss GGUF: llama.cpp reads sliding layers as every other one from layer 0; this "
                             f"model's are {[i for i, w in enumerate(windows) if w]}")
        return {"rope.freq_base_swa": float(cfg.rope_theta_local)} if cfg.rope_theta_local else {}

    def hf_tensor(self, weights, hf_name: str, src, sources: dict) -> bool:
        m = _EXPERTS_RE.match(hf_name)
        if m is None:
            return False
        layer, proj, kind = int(m[1]), m[2], m[3] or ""
        if kind == "_scales":
            return True  # read with its _blocks
        dtype, a = weights.source_array(src)
        names = [f"blk.{layer}.ffn_{p}_exps" for p in (("gate", "up") if proj == "gate_up_proj" else ("down",))]
        if kind == "_blocks":  # MXFP4 (E, rows, K/32, 16) + scales: rows are outputs, gate/up interleaved
            scales_src = sources.get(hf_name[:-len("_blocks")] + "_scales")
            if scales_src is None:
                weights.fail(f"{hf_name}: no matching _scales tensor")
            _, sc = weights.source_array(scales_src)
            if dtype != "U8" or a.ndim != 4 or sc.shape != a.shape[:3]:
                weights.fail(f"{hf_name}: {dtype} {a.shape} with scales {sc.shape} is not MXFP4 (E, N, K/32, 16)")
            E, N, G = sc.shape
            for i, name in enumerate(names):
                rows = slice(i, None, len(names))  # gate_up: even rows gate, odd rows up
                n = N // len(names)
                weights.add_tensor(name + ".weight", GT.MXFP4, (E, n, G * 32),
                                   lambda a=a, sc=sc, rows=rows: hf_to_gguf(a[:, rows], sc[:, rows]))
            return True
        gtype = weights.float_type(dtype, hf_name)
        if kind == "_bias":  # (E, 2I) interleaved, or (E, H)
            for i, name in enumerate(names):
                cols = slice(i, None, len(names))
                weights.add_tensor(name + ".bias", gtype, (a.shape[0], a.shape[1] // len(names)),
                                   lambda a=a, cols=cols: np.ascontiguousarray(a[:, cols]))
            return True
        if a.ndim != 3:  # float experts as x @ W: gate_up (E, H, 2I) with interleaved columns, down (E, I, H)
            weights.fail(f"{hf_name}: shape {a.shape} is not (E, K, N)")
        for i, name in enumerate(names):
            cols = slice(i, None, len(names))
            E, K, N = a.shape
            weights.add_tensor(name + ".weight", gtype, (E, N // len(names), K),
                               lambda a=a, cols=cols: np.ascontiguousarray(a[:, :, cols].transpose(0, 2, 1)))
        return True

    def block(self, cfg, layer: int):
        window = cfg.sliding_window(layer)
        theta = cfg.rope_theta_local if window and cfg.rope_theta_local else cfg.rope_theta
        attn = AttentionSpec(RopeSpec(theta, cfg.rope_scaling, neox=True), qkv_bias=cfg.attn_bias,
                             sliding_window=window, scale=cfg.attn_scale, o_bias=cfg.attn_out_bias, sinks=True)
        moe = MoESpec(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, norm_topk_prob=False,
                      act="swiglu_oai", scoring="topk_softmax", router_bias=True, expert_bias=True)
        return BlockSpec((Residual(attn, "attn_norm"), Residual(moe, "post_attention_norm")))
