"""Qwen 3 dense: the Llama block with per-head RMSNorm on Q and K (QK-norm), no biases."""
from __future__ import annotations

from engine.model.archs.llama import Llama
from engine.model.archs.qwen2 import qwen_layer_windows
from engine.model.registry import register


@register
class Qwen3(Llama):
    name = "qwen3"
    hf_model_types = ("qwen3",)
    rope_neox = True
    hf_permute_qk = False
    qk_norm = True

    def hf_layer_windows(self, cfg: dict, num_layers: int) -> tuple[int, ...]:
        return qwen_layer_windows(cfg, num_layers)
