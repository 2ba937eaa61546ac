"""dtype (vLLM's argument) does what it says: float32 computes long prefill chunks, their attention and the MoE
router in float32 (a tiny qwen3moe then agrees with transformers in float32 to ~1e-4 in logprob; in bfloat16 the
router can flip an expert), bfloat16 runs them in bfloat16, float16 is refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.args import EngineArgs
from tests.model.tiny_models import save_tiny_tokenizer, tiny_model

PROMPT = [int(t) for t in np.random.default_rng(7).integers(2, 256, 60)]  # one 60-row chunk: the dense path


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    hf = tiny_model("qwen3moe")
    folder = tmp_path_factory.mktemp("moe_dtype")
    hf.save_pretrained(folder, safe_serialization=True)
    save_tiny_tokenizer(folder)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([PROMPT])).logits[0].float(), dim=-1).numpy()
    return str(folder), ref


def prompt_logprobs(llm) -> np.ndarray:
    out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    return np.array([next(iter(d.values())).logprob for d in out.prompt_logprobs[1:]])


def test_float32_means_float32_everywhere(moe):
    folder, ref = moe
    llm = LLM(model=folder, dtype="float32", max_model_len=128, kv_cache_memory=0.05)
    assert llm.llm_engine.model.prefill_dtype == "float32"
    diff = np.abs(prompt_logprobs(llm) - ref[np.arange(len(PROMPT) - 1), PROMPT[1:]])
    # Measured: median 4e-4, max 1.7e-3 (logprobs around -6.5); with this host's bf16 long chunks (dtype auto on
    # AVX512-BF16) the max was 1.2.
    assert np.median(diff) < 1e-3 and diff.max() < 5e-3


def test_bfloat16_runs_long_chunks_in_bfloat16(moe):
    folder, _ = moe
    llm = LLM(model=folder, dtype="bfloat16", max_model_len=128, kv_cache_memory=0.05)
    assert llm.llm_engine.model.prefill_dtype == "bfloat16"


@pytest.mark.parametrize("dtype", ["float16", "half"])
def test_float16_is_refused(dtype):
    with pytest.raises(ValueError, match="not supported"):
        EngineArgs(dtype=dtype)


def test_unknown_dtype_and_conflicts_are_refused():
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineArgs(dtype="int8")
    with pytest.raises(ValueError, match="conflicts"):
        EngineArgs(dtype="float32", prefill_dtype="bfloat16")
    assert EngineArgs(dtype="float").effective_prefill_dtype() == "float32"
    assert EngineArgs(prefill_dtype="bfloat16").effective_prefill_dtype() == "bfloat16"
