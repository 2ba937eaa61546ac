"""HF config.json -> ModelConfig: the common keys here, each architecture's own in its Architecture.hf_config.

Text-only configs and multimodal ones (a nested text_config: its text model) both load; rope parameters come from
transformers 5's rope_parameters or 4's rope_theta / rope_scaling.
"""
from __future__ import annotations

import math
from typing import Any

from engine.errors import ModelLoadError
from engine.model.config import ModelConfig, RopeScaling
from engine.model.registry import architecture_of_model_type, hf_model_types


def _fail(source: str, reason: str):
    raise ModelLoadError(f"{source}: {reason}")


def _rope(cfg: dict, default_theta: float, source: str) -> tuple[float, RopeScaling]:
    """(rope_theta, scaling) from v5 rope_parameters or v4 rope_theta/rope_scaling."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5 with several layer types: one entry per type
        params = params["full_attention"] or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", default_theta)))
    sc = params if params.get("rope_type", "default") not in (None, "default") else (cfg.get("rope_scaling") or {})
    kind = sc.get("rope_type", sc.get("type")) or "default"
    factor = float(sc.get("factor") or 1.0)
    if kind == "proportional":  # Gemma 4: which frequencies turn is the architecture's; a factor divides them all
        kind = "linear"
    orig = int(sc.get("original_max_position_embeddings") or 0)
    if kind == "default" or (kind == "linear" and factor == 1.0):
        return theta, RopeScaling()
    if kind == "linear":
        return theta, RopeScaling("linear", factor, orig)
    if kind == "llama3":
        return theta, RopeScaling(
            "llama3", factor, orig or 8192, low_freq_factor=float(sc.get("low_freq_factor", 1.0)),
            high_freq_factor=float(sc.get("high_freq_factor", 4.0)))
    if kind == "yarn":
        # HF's attention_factor replaces yarn's mscale (0.1 ln(factor) + 1); ours multiplies it. Without one, HF
        # derives it from mscale and mscale_all_dim when both are given (DeepSeek: their ratio, 1.0 for V3).
        attn = sc.get("attention_factor")
        mscale = _yarn_mscale(factor, 1.0)
        if not attn and sc.get("mscale") and sc.get("mscale_all_dim"):
            attn = _yarn_mscale(factor, float(sc["mscale"])) / _yarn_mscale(factor, float(sc["mscale_all_dim"]))
        return theta, RopeScaling(
            "yarn", factor, orig or int(cfg.get("max_position_embeddings", 0) / factor),
            beta_fast=float(sc.get("beta_fast") or 32.0), beta_slow=float(sc.get("beta_slow") or 1.0),
            attn_factor=float(attn) / mscale if attn else 1.0, truncate=bool(sc.get("truncate", True)))
    _fail(source, f"rope scaling type '{kind}' is not supported (supported: linear, llama3, yarn)")


def _yarn_mscale(factor: float, mscale: float) -> float:
    """transformers' yarn_get_mscale."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _layer_windows(cfg: dict, arch, n: int) -> tuple[int, ...]:
    window = int(cfg.get("sliding_window") or 0)
    if window > 0 and cfg.get("use_bidirectional_attention"):  # transformers saves (W - 1) * 2, reads W (|i - j| < W)
        window = window // 2 + 1
    types = cfg.get("layer_types")
    if window > 0 and types:
        return tuple(window if t == "sliding_attention" else 0 for t in types)
    return arch.hf_layer_windows(cfg, n)


def _act(cfg: dict, source: str) -> str:
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if act == "silu":
        return "silu"
    if act in ("gelu_pytorch_tanh", "gelu_tanh"):
        return "gelu_tanh"
    if act == "gelu":
        return "gelu"
    _fail(source, f"activation '{act}' is not supported (silu, gelu_pytorch_tanh, gelu)")


def config_from_hf(config_json: dict, source: str = "config.json") -> ModelConfig:
    """ModelConfig from an HF config.json dict.

    Args:
        config_json: the parsed config.json (a multimodal gemma3 config's text_config is used).
        source: what to name in error messages.
    Raises:
        ModelLoadError: unsupported model_type, missing keys, unsupported rope scaling or activation.
    """
    mt = config_json.get("model_type")
    cfg = config_json
    if isinstance(cfg.get("text_config"), dict):  # a multimodal config: its text model
        outer = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config", "audio_config")}
        cfg = {**outer, **cfg["text_config"]}
        mt = cfg.get("model_type") if cfg.get("model_type") in hf_model_types() else mt
    arch = architecture_of_model_type(mt, source)

    def need(key: str) -> Any:
        if cfg.get(key) is None:
            _fail(source, f"missing required key '{key}'")
        return cfg[key]

    hidden, n_layers, n_heads = int(need("hidden_size")), int(need("num_hidden_layers")), int(
        need("num_attention_heads"))
    n_kv = int(cfg.get("num_key_value_heads") or n_heads)
    head_dim = int(cfg.get("head_dim") or hidden // n_heads)
    theta, scaling = _rope(cfg, arch.hf_default_rope_theta, source)
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    kw: dict[str, Any] = dict(
        arch=arch.name, vocab_size=int(need("vocab_size")), hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or 0), num_layers=n_layers,
        num_heads=n_heads, num_kv_heads=n_kv, head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", arch.hf_tie_default)),
        layer_sliding_window=_layer_windows(cfg, arch, n_layers),
        attn_logit_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        final_logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        hidden_act=_act(cfg, source), bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids,
        name=str(cfg.get("_name_or_path", "")),
    )
    arch.hf_config(cfg, kw, need)
    if arch.dense_ffn and kw["intermediate_size"] <= 0:
        need("intermediate_size")
    return ModelConfig(**kw)
