"""A matrix of a CPU layer overridden onto the device (llama.cpp's -ot) leaves that layer running kernel by kernel
with the device Linear inside; every other layer still decodes as one fused call (it crashed at the first decode
step, reading a bias the device module does not have)."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.model import fused_compile
from gpu_kernels.modules import OnDevice
from tests.fused_calls import count_fused_calls


@pytest.mark.parametrize("tensor,leaf", [("ffn_down", (1, "down")), ("attn_output", (0, "o"))])
def test_a_matrix_on_the_device_inside_a_cpu_layer_decodes(tensor, leaf, monkeypatch):
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "inline")
    llm = LLM(gpu_device="cpu", override_tensor=rf"blk\.0\.{tensor}=GPU", max_model_len=256, kv_cache_memory=0.1)
    blocks = llm.llm_engine.model.blocks
    part, attr = leaf
    assert isinstance(getattr(blocks[0].parts[part], attr), OnDevice)
    calls = count_fused_calls(monkeypatch)
    out = llm.generate("The capital of France is", SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert len(out.outputs[0].token_ids) == 4
    assert blocks[0].fused.args is False  # layer 0 ran its parts one by one
    assert calls[0] == 4 * (len(blocks) - 1)  # every other layer ran the short prompt and 3 decode steps fused
