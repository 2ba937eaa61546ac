"""A tiny qwen3.5 through the engine: its linear-attention layers keep a state per request (engine/core/hybrid_cache.py),
so batching, odd chunk sizes, prefix-cache hits (the state restored at a block boundary) and preemption must each give
every request its solo answer: bit for bit under batch_invariant, up to the first near tie otherwise."""
from __future__ import annotations

import numpy as np
import pytest

from engine import LLM, SamplingParams
from tests.model.tiny_models import save_tiny_tokenizer, tiny_model
from tests.near_ties import assert_same_up_to_near_ties

_rng = np.random.default_rng(11)
_ids = lambda n: [int(t) for t in _rng.integers(2, 256, n)]  # noqa: E731 (t1 is EOS)
SHARED = _ids(50)
# short, a chunk of the chunked form (> 64 rows), odd lengths, and two prompts sharing 50 tokens (3 full blocks)
PROMPTS = [_ids(5), _ids(70), _ids(33), SHARED + _ids(9), _ids(19), SHARED + _ids(14)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True)
COMMON = dict(max_model_len=256, kv_cache_memory=0.05, dtype="float32")


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    tiny_model(request.param).save_pretrained(path, safe_serialization=True)
    save_tiny_tokenizer(path)
    return str(path)


def generate(llm, prompts, params=GREEDY):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def solo(folder, params=GREEDY, **kw):
    llm = LLM(model=folder, enable_prefix_caching=False, **{**COMMON, **kw})
    return [generate(llm, [p], params)[0] for p in PROMPTS]


def tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def invariant_solo(folder):
    return tokens(solo(folder, batch_invariant=True))


@pytest.mark.parametrize("budget,caching,blocks,slots", [
    (2048, False, None, None),   # all at once
    (7, True, None, None),       # odd chunks, with the prefix cache
    (37, True, None, 4),         # 3 live states at most: admissions wait for slots
    (2048, True, 14, None),      # a pool of 13 blocks: preemption (recompute)
])
def test_batch_invariant_answers_are_the_solo_ones(folder, invariant_solo, budget, caching, blocks, slots):
    llm = LLM(model=folder, batch_invariant=True, max_num_batched_tokens=budget, enable_prefix_caching=caching,
              num_gpu_blocks_override=blocks, num_state_slots=slots, **COMMON)
    if caching:  # warm the prefix cache: the second pass restores checkpointed states
        generate(llm, PROMPTS[:4])
    outs = generate(llm, PROMPTS)
    assert tokens(outs) == invariant_solo
    engine = llm.llm_engine
    if caching and not blocks and not slots:  # (3 slots go to live states first: few checkpoints)
        assert outs[5].num_cached_tokens == 48 and engine.kv_manager.states.num_checkpoints > 0
    if blocks:
        assert engine.scheduler.num_preemptions > 0
    assert engine.kv_manager.usage == 0.0 and len(engine.kv_manager.states.free) + \
        engine.kv_manager.states.num_checkpoints == engine.kv_manager.states.num_usable


@pytest.mark.parametrize("budget", [2048, 7, 37])
def test_batched_answers_match_solo_up_to_near_ties(folder, budget):
    ref = solo(folder)
    llm = LLM(model=folder, max_num_batched_tokens=budget, **COMMON)
    generate(llm, PROMPTS[:4])
    assert_same_up_to_near_ties(ref, generate(llm, PROMPTS))


def test_prefix_hit_restores_the_state_at_a_block_boundary(folder):
    """The second prompt sharing 50 tokens hits 3 blocks (48 tokens): the state saved at token 48 by the first one's
    step is copied into its slot; its answer is its solo one."""
    llm = LLM(model=folder, batch_invariant=True, **COMMON)
    first = generate(llm, [PROMPTS[3]])[0]
    second = generate(llm, [PROMPTS[5]])[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 48
    alone = LLM(model=folder, batch_invariant=True, enable_prefix_caching=False, **COMMON)
    assert tokens([second]) == tokens(generate(alone, [PROMPTS[5]]))


def test_ram_tier_is_refused(folder):
    with pytest.raises(ValueError, match="num-cpu-blocks"):
        LLM(model=folder, num_cpu_blocks=4, **COMMON)


def test_torch_twin_layers_keep_their_states_on_the_device(folder):
    """Every layer on torch's CPU device (state pools allocated there, checkpoints copied there): the CPU answers."""
    ref = solo(folder)
    llm = LLM(model=folder, n_gpu_layers="all", gpu_device="cpu", max_num_batched_tokens=37, **COMMON)
    engine = llm.llm_engine
    import torch
    assert all(isinstance(p, torch.Tensor) for i in engine.runner.state_layers for p in engine.runner.kv_caches[i])
    generate(llm, PROMPTS[:4])
    outs = generate(llm, PROMPTS)
    assert outs[5].num_cached_tokens == 48
    assert_same_up_to_near_ties(ref, outs)
