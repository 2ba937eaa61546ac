"""kv_cache_dtype fp8 / fp8_e4m3 / fp8_e5m2 / int8 through the engine: one byte per cached value (int8: q8_0 blocks,
34 bytes per 32), the model's logits near fp32 KV's (the kernels are exact over the decoded bytes:
tests/cpu_kernels/test_attention_fp8.py, test_attention_q8.py), batched requests equal to their solo runs,
prefix-cache hits equal to fresh runs; GPU layers refuse them by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.worker.runner import ModelRunner
from tests.model.test_architectures import PROMPTS, rel_err, run_incremental
from tests.model.tiny_models import save_tiny_tokenizer, tiny_model
from tests.offload.helpers import cpu_runner, incremental, placed

# e4m3 keeps 3 mantissa bits (~3 % per value), e5m2 2, int8 a step of amax / 127 per 32 values; deepseek2's tiny MLA
# amplifies cache rounding ~10x (the same error as rounding an fp32 cache to e4m3 by torch), so its fp8 logits are
# compared for shape only
TOL = {"fp8": 0.1, "fp8_e4m3": 0.1, "fp8_e5m2": 0.2, "int8": 0.03}
STORAGE = {"fp8": (np.uint8, 4), "fp8_e4m3": (np.uint8, 4), "fp8_e5m2": (np.int8, 4), "int8": (np.uint8, 5)}
# deepseek2's latent rows (kv_lora_rank 256 + rope dims) in whole q8_0 blocks of 32
OVERRIDES = {"deepseek2": dict(qk_rope_head_dim=32)}


@pytest.fixture(scope="module", params=["qwen3", "gemma3", "qwen35moe", "deepseek2"])
def model_folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"kvfp8-{request.param}")
    tiny_model(request.param, **OVERRIDES.get(request.param, {})).save_pretrained(path, safe_serialization=True)
    save_tiny_tokenizer(path)
    return request.param, str(path)


@pytest.mark.parametrize("kv", list(TOL))
def test_one_byte_cache_is_bytes_and_logits_stay_near_fp32(model_folder, kv):
    from engine.model.loader import load_model
    arch, path = model_folder
    model, _ = load_model(path)
    runner = ModelRunner(model, num_blocks=8, block_size=4, kv_cache_dtype=kv)
    dtype, ndim = STORAGE[kv]
    paged = [c for c in runner.kv_caches if c is not None and hasattr(c[0], "dtype") and c[0].ndim >= 4]
    assert paged and all(a.dtype == dtype and a.ndim == ndim for c in paged for a in c)
    got, ref = run_incremental(model, PROMPTS[0], 3, kv=kv), run_incremental(model, PROMPTS[0], 3)
    assert np.isfinite(got).all() and got.shape == ref.shape
    if arch != "deepseek2" or kv == "int8":
        assert rel_err(got, ref) < TOL[kv], (arch, kv, rel_err(got, ref))


@pytest.mark.parametrize("kv", ["fp8", "int8"])
def test_engine_with_one_byte_kv_batches_and_prefix_hits_equal_solo_runs(model_folder, kv):
    arch, path = model_folder
    llm = LLM(model=path, kv_cache_dtype=kv, max_model_len=64, num_gpu_blocks_override=64, block_size=4)
    sp = SamplingParams(max_tokens=6, temperature=0.0)
    prompts = [{"prompt_token_ids": list(p)} for p in PROMPTS[:3]]
    solo = [llm.generate([p], sp)[0].outputs[0].token_ids for p in prompts]
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]  # the prompts' blocks are cached now
    assert together == solo


@pytest.mark.parametrize("arch", ["qwen3", "deepseek2"])
@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2", "int8"])
def test_device_layers_keep_one_byte_kv(tmp_path, arch, kv):
    """Layers placed on torch's CPU device keep their cache in the CPU's storage (the same bytes: the device and CPU
    writers agree, tests/gpu_kernels/test_kernels.py) and their logits stay as near fp32 KV as the CPU's do."""
    path = tmp_path / "m"
    tiny_model(arch, **OVERRIDES.get(arch, {})).save_pretrained(path, safe_serialization=True)
    model, runner, p, _ = placed(str(path), kv=kv, n_gpu_layers="1")
    dtype, ndim = STORAGE[kv]
    dev = [c for c in runner.kv_caches if isinstance(c[0], torch.Tensor)]
    assert dev and all(a.dtype == getattr(torch, np.dtype(dtype).name) and a.dim() == ndim for c in dev for a in c)
    got, ref = incremental(runner), incremental(cpu_runner(str(path)))
    assert np.isfinite(got).all() and got.shape == ref.shape
    if arch != "deepseek2" or kv == "int8":
        assert rel_err(got, ref) < TOL[kv], (kv, rel_err(got, ref))


def test_int8_kv_refuses_a_head_dim_out_of_blocks(tmp_path):
    path = tmp_path / "m"
    tiny_model("deepseek2").save_pretrained(path, safe_serialization=True)  # latent 256 + 16 rope dims
    save_tiny_tokenizer(path)
    with pytest.raises(ValueError, match="head_dim divisible by 32, this model's is 272"):
        LLM(model=str(path), kv_cache_dtype="int8", max_model_len=64, num_gpu_blocks_override=64, block_size=4)
