"""Batching, chunking, prefix caching and preemption must not change answers (gemma-3-270m).

Rule (issue 3): a batched run equals the one-by-one run up to the first position where the one-by-one
run had a near tie (top-2 logprobs within 0.1); under batch_invariant it is identical token for token.
"""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.near_ties import assert_same_up_to_near_ties

PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time", "The three primary colors are",
    "Water boils at", "import numpy as np\n", "My favourite food is", "The sun rises in the",
    "In 1492, Columbus", "A haiku about winter:", "The largest planet is", "SELECT * FROM",
    "To be or not to be,", "The square root of 16 is", "Dear Sir or Madam,", "Photosynthesis is",
]
MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2, ignore_eos=True)
COMMON = dict(max_model_len=512, kv_cache_memory=0.25)
# Long enough that every sequence outgrows its first block: a 6-block pool must then preempt.
LONGER = SamplingParams(temperature=0.0, max_tokens=24, logprobs=2, ignore_eos=True)
TINY_POOL = 6


def one_by_one(llm, prompts, params=GREEDY):
    return [llm.generate(p, params, use_tqdm=False)[0] for p in prompts]


@pytest.fixture(scope="module")
def reference():
    llm = LLM(**COMMON)
    return one_by_one(llm, PROMPTS)


@pytest.mark.parametrize("budget", [16, 64, 2048])
def test_batched_equals_one_by_one_up_to_near_ties(reference, budget):
    llm = LLM(max_num_batched_tokens=budget, **COMMON)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_same_up_to_near_ties(reference, outs)


@pytest.fixture(scope="module")
def invariant_reference():
    llm = LLM(batch_invariant=True, enable_prefix_caching=False, **COMMON)
    return [o.outputs[0].token_ids for o in one_by_one(llm, PROMPTS)]


@pytest.mark.parametrize("budget,caching,blocks", [(16, True, None), (64, False, None), (2048, True, None),
                                                    (2048, True, TINY_POOL)])
def test_batch_invariant_mode_is_identical(invariant_reference, budget, caching, blocks):
    llm = LLM(batch_invariant=True, max_num_batched_tokens=budget, enable_prefix_caching=caching,
              num_gpu_blocks_override=blocks, **COMMON)
    if caching:  # warm the prefix cache with a first pass, so the second reuses blocks
        llm.generate(PROMPTS[:4], GREEDY, use_tqdm=False)
    outs = llm.generate(PROMPTS, LONGER if blocks else GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids[:MAX_TOKENS] for o in outs] == invariant_reference
    if blocks:
        assert llm.llm_engine.scheduler.num_preemptions > 0


PREFIX = " ".join(f"item{i}" for i in range(150))  # ~300 tokens


@pytest.mark.parametrize("invariant", [False, True])
def test_prefix_cache_hit_reports_cached_tokens_and_same_output(invariant):
    a = "Shared context: " + PREFIX + "\nQuestion one: what comes next?"
    b = "Shared context: " + PREFIX + "\nQuestion two: count the items."
    cached = LLM(batch_invariant=invariant, **COMMON)
    first, second = (cached.generate(p, GREEDY, use_tqdm=False)[0] for p in (a, b))
    shared = len(cached.get_tokenizer().encode("Shared context: " + PREFIX))
    assert shared >= 300
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens >= (shared // 16) * 16 - 16
    plain = LLM(batch_invariant=invariant, enable_prefix_caching=False, **COMMON)
    ref = plain.generate(b, GREEDY, use_tqdm=False)[0]
    assert ref.num_cached_tokens == 0
    if invariant:
        assert second.outputs[0].token_ids == ref.outputs[0].token_ids
    else:
        assert_same_up_to_near_ties([ref], [second])


def test_tiny_kv_pool_preempts_and_still_finishes_everything(reference):
    llm = LLM(num_gpu_blocks_override=TINY_POOL, **COMMON)  # 5 usable blocks of 16 tokens
    outs = llm.generate(PROMPTS, LONGER, use_tqdm=False)
    assert all(o.finished and len(o.outputs[0].token_ids) == LONGER.max_tokens for o in outs)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert_same_up_to_near_ties(reference, outs)
    assert llm.llm_engine.kv_manager.usage == 0.0
