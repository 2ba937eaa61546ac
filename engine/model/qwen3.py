"""Qwen 3 dense: the Llama block with per-head RMSNorm on Q and K (QK-norm), no biases."""
from engine.model.llama import LlamaModel
from engine.model.registry import register


@register("qwen3")
class Qwen3Model(LlamaModel):
    qk_norm = True
