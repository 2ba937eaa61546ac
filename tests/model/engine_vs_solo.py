"""The engine-level check the new cache kinds share (MLA latents, Gemma 4's KV-shared layers): batched, chunked at
odd chunk sizes, with prefix-cache hits and preemption, each request's answer equals its solo run (token for token
under batch_invariant; up to the first near tie otherwise, the rule of tests/engine/worker/test_batching.py)."""
from __future__ import annotations

import numpy as np

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
# (max_num_batched_tokens, prefix caching, pool override) for the batch-invariant runs, and without caching's
# column for the default-mode ones
INVARIANT_CASES = [(7, False, None), (13, True, None), (2048, True, None), (2048, True, TINY_POOL),
                   (11, True, TINY_POOL)]
DEFAULT_CASES = [(5, None), (17, None), (2048, None), (2048, TINY_POOL)]


def tiny_folder(path, arch: str) -> str:
    tiny_model(arch).save_pretrained(path, safe_serialization=True)
    save_tiny_tokenizer(path)
    return str(path)


def prompts():
    return [{"prompt_token_ids": p} for p in PROMPTS]


def one_by_one(llm, params=GREEDY):
    return [llm.generate(p, params, use_tqdm=False)[0] for p in prompts()]


def ids(outs, n=None):
    return [o.outputs[0].token_ids[:n] for o in outs]


def solo_invariant_llm(folder) -> LLM:
    return LLM(model=folder, batch_invariant=True, enable_prefix_caching=False, **COMMON)


def check_batch_invariant(folder, solo, budget, caching, blocks) -> None:
    llm = LLM(model=folder, batch_invariant=True, max_num_batched_tokens=budget, enable_prefix_caching=caching,
              num_gpu_blocks_override=blocks, **COMMON)
    if caching:  # a first pass fills the prefix cache: the shared-prefix prompts then start from cached blocks
        llm.generate(prompts()[-1:], GREEDY, use_tqdm=False)
    outs = llm.generate(prompts(), LONGER, use_tqdm=False)
    assert ids(outs) == solo, (budget, caching, blocks)
    if caching and not blocks:  # (a tiny pool evicts the cached blocks)
        assert all(o.num_cached_tokens >= 32 for o in outs[-3:])
    if blocks:
        assert llm.llm_engine.scheduler.num_preemptions > 0
    assert llm.llm_engine.kv_manager.usage == 0.0  # every block given back


def solo_default(folder):
    return one_by_one(LLM(model=folder, enable_prefix_caching=False, **COMMON))


def check_default(folder, solo, budget, blocks) -> None:
    llm = LLM(model=folder, max_num_batched_tokens=budget, num_gpu_blocks_override=blocks, **COMMON)
    llm.generate(prompts()[-1:], GREEDY, use_tqdm=False)
    outs = llm.generate(prompts(), LONGER if blocks else GREEDY, use_tqdm=False)
    assert_same_up_to_near_ties(solo, outs)
    if blocks:
        assert llm.llm_engine.scheduler.num_preemptions > 0
    assert llm.llm_engine.kv_manager.usage == 0.0
