"""Qwen 2 / 2.5: the Llama block with biases on Q, K and V and NeoX RoPE."""
from engine.model.llama import LlamaModel
from engine.model.registry import register


@register("qwen2")
class Qwen2Model(LlamaModel):
    qkv_bias = True
