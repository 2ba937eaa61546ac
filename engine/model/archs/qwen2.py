"""Qwen 2 / 2.5: the Llama block with biases on Q, K and V and NeoX RoPE."""
from __future__ import annotations

from engine.model.archs.llama import Llama
from engine.model.registry import register


def qwen_layer_windows(cfg: dict, num_layers: int) -> tuple[int, ...]:
    """transformers' Qwen configs: a sliding window only with use_sliding_window, from max_window_layers up."""
    window = int(cfg.get("sliding_window") or 0)
    if window <= 0 or not cfg.get("use_sliding_window"):
        return ()
    first = int(cfg.get("max_window_layers", 0))
    return tuple(window if i >= first else 0 for i in range(num_layers))


@register
class Qwen2(Llama):
    name = "qwen2"
    hf_model_types = ("qwen2",)
    rope_neox = True
    hf_permute_qk = False
    qkv_bias = True

    def hf_layer_windows(self, cfg: dict, num_layers: int) -> tuple[int, ...]:
        return qwen_layer_windows(cfg, num_layers)
