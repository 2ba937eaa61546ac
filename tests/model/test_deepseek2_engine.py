"""The engine over the latent cache (tiny DeepSeek-V3, MLA): batched, chunked at odd chunk sizes, with prefix-cache
hits and preemption, each request's answer equals its solo run (token for token under batch_invariant; up to the
first near tie otherwise, the rule of tests/engine/worker/test_batching.py)."""
from __future__ import annotations

import numpy as np
import pytest

from engine import LLM, SamplingParams
from tests.model.tiny_models import save_tiny_tokenizer, tiny_model
from tests.near_ties import assert_same_up_to_near_ties

_rng = np.random.default_rng(11)
SHARED = [int(t) for t in _rng.integers(2, 256, 37)]  # two blocks and a bit: prefix-cache hits
PROMPTS = [[int(t) for t in _rng.integers(2, 256, n)] for n in (5, 23, 41, 9, 30)]
PROMPTS += [SHARED + [int(t) for t in _rng.integers(2, 256, n)] for n in (3, 8, 12)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, logprobs=2, ignore_eos=True)
LONGER = SamplingParams(temperature=0.0, max_tokens=24, logprobs=2, ignore_eos=True)
COMMON = dict(max_model_len=128, kv_cache_memory=0.02)
TINY_POOL = 6  # 5 usable blocks of 16 tokens: running requests outgrow it and are preempted


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("deepseek_engine")
    tiny_model("deepseek2").save_pretrained(path, safe_serialization=True)
    save_tiny_tokenizer(path)
    return str(path)


def _prompts():
    return [{"prompt_token_ids": p} for p in PROMPTS]


def one_by_one(llm, params=GREEDY):
    return [llm.generate(p, params, use_tqdm=False)[0] for p in _prompts()]


def ids(outs, n=None):
    return [o.outputs[0].token_ids[:n] for o in outs]


@pytest.fixture(scope="module")
def solo_invariant(folder):
    llm = LLM(model=folder, batch_invariant=True, enable_prefix_caching=False, **COMMON)
    assert llm.llm_engine.runner.kv_caches[0][0] is llm.llm_engine.runner.kv_caches[0][1]  # the latent cache
    return ids(one_by_one(llm, LONGER))


@pytest.mark.parametrize("budget,caching,blocks", [(7, False, None), (13, True, None), (2048, True, None),
                                                    (2048, True, TINY_POOL), (11, True, TINY_POOL)])
def test_batch_invariant_runs_equal_each_solo_run(folder, solo_invariant, budget, caching, blocks):
    llm = LLM(model=folder, batch_invariant=True, max_num_batched_tokens=budget, enable_prefix_caching=caching,
              num_gpu_blocks_override=blocks, **COMMON)
    if caching:  # a first pass fills the prefix cache: the shared-prefix prompts then start from cached blocks
        llm.generate(_prompts()[-1:], GREEDY, use_tqdm=False)
    outs = llm.generate(_prompts(), LONGER, use_tqdm=False)
    assert ids(outs) == solo_invariant
    if caching and not blocks:  # (a tiny pool evicts the cached blocks)
        assert all(o.num_cached_tokens >= 32 for o in outs[-3:])
    if blocks:
        assert llm.llm_engine.scheduler.num_preemptions > 0
    assert llm.llm_engine.kv_manager.usage == 0.0  # every block given back


@pytest.fixture(scope="module")
def solo_default(folder):
    llm = LLM(model=folder, enable_prefix_caching=False, **COMMON)
    return one_by_one(llm)


@pytest.mark.parametrize("budget,blocks", [(5, None), (17, None), (2048, None), (2048, TINY_POOL)])
def test_default_mode_equals_solo_up_to_near_ties(folder, solo_default, budget, blocks):
    llm = LLM(model=folder, max_num_batched_tokens=budget, num_gpu_blocks_override=blocks, **COMMON)
    llm.generate(_prompts()[-1:], GREEDY, use_tqdm=False)
    outs = llm.generate(_prompts(), LONGER if blocks else GREEDY, use_tqdm=False)
    assert_same_up_to_near_ties(solo_default, outs)
    if blocks:
        assert llm.llm_engine.scheduler.num_preemptions > 0
    assert llm.llm_engine.kv_manager.usage == 0.0
