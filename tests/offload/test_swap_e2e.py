"""--num-cpu-blocks end to end on a tiny llama placed on torch's CPU device: a device KV pool too small for
every request preempts by swapping to the RAM tier, and the greedy tokens stay those of a big pool."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from engine import LLM, SamplingParams
from tests.model.tiny_models import tiny_model
from tests.near_ties import assert_same_up_to_near_ties

SHARED = [7, 8, 9, 10]  # one full 4-token block every prompt starts with: prefix-cache hits share it
PROMPTS = [{"prompt_token_ids": SHARED + [20 + 3 * i + j for j in range(6)]} for i in range(4)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True)
# 10 + 12 - 1 = 21 KV tokens = 6 blocks of 4 per request: 12 usable blocks hold two requests, not four.
COMMON = dict(block_size=4, max_model_len=64, kv_cache_dtype="fp16", gpu_device="cpu", max_num_seqs=4)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama_swap")
    tiny_model("llama").save_pretrained(path, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(256)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))  # the engine loads a tokenizer even for token-id prompts
    return str(path)


@pytest.fixture(scope="module")
def reference(folder):
    return LLM(folder, n_gpu_layers="all", num_gpu_blocks_override=64, **COMMON).generate(
        PROMPTS, GREEDY, use_tqdm=False)


def assert_same_logprobs_while_tokens_agree(ref_outs, outs, tol=1e-3):
    """A corrupted swap moves logprobs even where the argmax survives (this tiny model has near ties
    after a few tokens): the sampled tokens' logprobs agree up to the first differing token."""
    for ref, got in zip(ref_outs, outs):
        r, g = ref.outputs[0], got.outputs[0]
        for i, (a, b) in enumerate(zip(r.token_ids, g.token_ids)):
            if a != b:
                break
            assert abs(r.logprobs[i][a].logprob - g.logprobs[i][b].logprob) < tol, (ref.prompt_token_ids, i)


@pytest.mark.parametrize("n_gpu_layers,num_cpu_blocks", [("all", 24), ("1", 24), ("all", 6)],
                         ids=["all-layers", "mixed-ram-layer", "tier-full"])
def test_swap_preemption_keeps_greedy_tokens(folder, reference, n_gpu_layers, num_cpu_blocks):
    llm = LLM(folder, n_gpu_layers=n_gpu_layers, num_gpu_blocks_override=13, num_cpu_blocks=num_cpu_blocks,
              **COMMON)
    engine = llm.llm_engine
    assert engine.kv_manager.num_usable_blocks == 12 and engine.kv_manager.num_cpu_blocks == num_cpu_blocks
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_same_up_to_near_ties(reference, outs)
    assert_same_logprobs_while_tokens_agree(reference, outs)
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)
    st = engine.stats()
    assert st.num_swap_outs > 0 and st.num_swap_ins == st.num_swap_outs and st.num_swapped == 0
    if num_cpu_blocks >= 18:  # room for every request that can wait: no preemption recomputes
        assert st.num_preemptions == st.num_swap_outs
    else:  # room for one request's blocks: a second preemption meanwhile recomputes
        assert st.num_preemptions > st.num_swap_outs
    kv = engine.kv_manager
    assert kv.num_free_blocks == kv.num_usable_blocks and kv.swap_space.num_free_blocks == num_cpu_blocks
    assert engine.kv_tier.allocated
