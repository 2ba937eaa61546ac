"""Gemma 3 (text): sandwich norms, QK-norm, GELU-tanh MLP, sliding-window layers with their own RoPE base."""
from __future__ import annotations

import math

from cpu_kernels.rope import RopeScaling
from engine.model.architecture import Architecture
from engine.model.registry import register
from engine.model.pooling_types import POOLING_TYPES
from engine.model.spec import AttentionSpec, BlockSpec, GatedMLPSpec, Residual, RopeSpec

SWA_PERIOD = 6  # llama.cpp set_swa_pattern(6): every 6th layer is global
ROPE_THETA_LOCAL = 10000.0


@register
class Gemma3(Architecture):
    name = "gemma3"
    hf_model_types = ("gemma3_text", "gemma3")
    embed_scale = True
    hf_layer_map = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                    "post_feedforward_layernorm": "post_ffw_norm"}
    hf_norm_offset = 1.0
    hf_tie_default = True
    hf_default_rope_theta = 1e6

    def gguf_config(self, m, kw) -> None:
        # llama.cpp runs sliding-window attention for gemma3 only among these architectures.
        window = m.num("attention.sliding_window", 0)
        kw.update(hidden_act="gelu_tanh", rope_theta_local=ROPE_THETA_LOCAL)
        n = kw["num_layers"]
        if window > 0:
            kw["layer_sliding_window"] = tuple(0 if (i + 1) % SWA_PERIOD == 0 else window for i in range(n))
        # llama.cpp: gemma3-27B (62 layers) scales by hidden/heads, every other size by head_dim.
        scale_dim = kw["hidden_size"] / kw["num_heads"] if n == 62 else kw["head_dim"]
        kw["attn_scale"] = 1.0 / math.sqrt(scale_dim)

    def hf_config(self, cfg: dict, kw, need) -> None:
        local = (cfg.get("rope_parameters") or {}).get("sliding_attention") or {}
        kw["rope_theta_local"] = float(local.get("rope_theta", cfg.get("rope_local_base_freq", ROPE_THETA_LOCAL)))
        kw["attn_scale"] = float(cfg.get("query_pre_attn_scalar") or kw["head_dim"]) ** -0.5
        kw["bidirectional"] = bool(cfg.get("use_bidirectional_attention"))  # EmbeddingGemma

    def hf_layer_windows(self, cfg: dict, num_layers: int) -> tuple[int, ...]:
        window = int(cfg.get("sliding_window") or 0)
        if window <= 0:
            return ()
        if cfg.get("use_bidirectional_attention"):  # transformers saves (W - 1) * 2, reads W (|i - j| < W)
            window = window // 2 + 1
        period = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or SWA_PERIOD)
        return tuple(0 if (i + 1) % period == 0 else window for i in range(num_layers))

    def block(self, cfg, layer: int):
        window = cfg.sliding_window(layer)
        if window:  # local layers: their own base, no scaling (HF's rotary_emb_local)
            rope = RopeSpec(cfg.rope_theta_local or cfg.rope_theta, RopeScaling(), neox=True)
        else:
            rope = RopeSpec(cfg.rope_theta, cfg.rope_scaling, neox=True, freqs_tensor=True)
        attn = AttentionSpec(rope, qk_norm=True, sliding_window=window, softcap=cfg.attn_logit_softcap,
                             scale=cfg.attn_scale, bidirectional=cfg.bidirectional)
        return BlockSpec((Residual(attn, "attn_norm", "post_attention_norm"),
                          Residual(GatedMLPSpec(cfg.hidden_act), "ffn_norm", "post_ffw_norm")))


@register
class GemmaEmbedding(Gemma3):
    """llama.cpp's gemma-embedding (EmbeddingGemma as its converter writes it): gemma3's layers attending both ways, a
    sliding layer over |i - j| <= sliding_window / 2 (llama.cpp's symmetric window on transformers' saved value), mean
    pooling (pooling_type), and sentence-transformers' two Dense projections as dense_2 / dense_3 tensors. HF
    EmbeddingGemma folders are gemma3 configs with use_bidirectional_attention."""
    name = "gemma-embedding"
    hf_model_types = ()

    def gguf_config(self, m, kw) -> None:
        super().gguf_config(m, kw)
        saved = m.num("attention.sliding_window", 0)
        window = saved // 2 + 1 if saved > 0 else 0  # |i - j| <= saved / 2, i.e. < window
        n = kw["num_layers"]
        kw["layer_sliding_window"] = tuple(0 if (i + 1) % SWA_PERIOD == 0 else window for i in range(n)) \
            if window else ()
        kw.update(attn_scale=kw["head_dim"] ** -0.5, bidirectional=True,
                  pooling_type=POOLING_TYPES.get(m.num("pooling_type", 1), ""))

    def gguf_metadata(self, cfg) -> dict:
        windows = [w for w in cfg.layer_sliding_window if w]
        codes = {v: k for k, v in POOLING_TYPES.items()}
        md = {"pooling_type": codes.get(cfg.pooling_type or "MEAN", 1)}
        if windows:
            md["attention.sliding_window"] = (windows[0] - 1) * 2  # transformers' saved value, as the converter writes
        return md
