"""Speculative decoding with a draft model (engine/spec_decode/draft_model.py): tiny random targets drafted by noisy
copies of themselves (so the drafts agree often, not always): greedy output token for token the same as without
drafts, batched and alone, with the draft's KV rolled back after rejections; sampled output distributed as without
drafts; a draft of another vocabulary refused."""
from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
import transformers

from engine import LLM, SamplingParams
from tests.engine.test_spec_verify import _chi_square_p
from tests.model.tiny_models import save_tiny_tokenizer, tiny_model


def _noisy_copy(hf, folder, scale: float, seed: int = 0) -> str:
    """hf's weights plus Gaussian noise of `scale` times each tensor's spread, saved with the tiny tokenizer."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std())
    hf.save_pretrained(folder, safe_serialization=True)
    save_tiny_tokenizer(folder)
    return str(folder)


@pytest.fixture(scope="module")
def target_and_draft(tmp_path_factory):
    target, draft = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft")
    hf = tiny_model("llama")
    with torch.no_grad():  # sharper next-token distributions than random weights give: a few likely tokens
        hf.lm_head.weight.mul_(4.0)
    hf.save_pretrained(target, safe_serialization=True)
    save_tiny_tokenizer(target)
    return str(target), _noisy_copy(hf, draft, 0.05)


def _tokens(outs):
    return [[list(c.token_ids) for c in o.outputs] for o in outs]


def test_greedy_output_is_the_same_token_for_token(target_and_draft):
    target, draft = target_and_draft
    kw = dict(model=target, max_model_len=256, kv_cache_memory=0.05, max_num_seqs=2)
    prompts = ["t1 t9 t33 t4", "t50 t2", "t7 t7 t8 t9 t10 t11 t12", "t100"]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    spec = LLM(speculative_config={"model": draft, "num_speculative_tokens": 4}, **kw)
    want = _tokens(LLM(**kw).generate(prompts, params, use_tqdm=False))
    assert _tokens(spec.generate(prompts, params, use_tqdm=False)) == want
    st = spec.llm_engine.spec_stats
    assert st.num_accepted_tokens > 40 and st.num_accepted_tokens < st.num_draft_tokens  # agrees often, not always
    for p, w in zip(prompts, want):  # alone, after the batch (the draft's blocks were all given back)
        assert _tokens(spec.generate([p], params, use_tqdm=False)) == [w]
    blocks = spec.llm_engine.speculator.proposer.blocks
    assert blocks.num_free == blocks.num_blocks - 1


def test_sampled_output_is_distributed_as_without_drafts(target_and_draft):
    """n completions with and without drafts: how often each of tokens 1..3 is the draft model's own guess (what a
    check that keeps drafts too often inflates) is distributed alike (two-sample chi-square)."""
    target, draft = target_and_draft
    kw = dict(model=target, max_model_len=128, kv_cache_memory=0.05, seed=0, max_num_seqs=2)
    params = SamplingParams(n=400, temperature=1.0, max_tokens=4, ignore_eos=True)
    base, spec = LLM(**kw), LLM(speculative_config={"model": draft, "num_speculative_tokens": 3}, **kw)
    prompt = base.get_tokenizer().encode("t3 t4")
    hf = transformers.AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32)

    @functools.cache
    def guess(prefix):
        with torch.no_grad():
            return int(hf(torch.tensor([prompt + list(prefix)])).logits[0, -1].argmax())

    def follows(ids):
        return tuple(guess(tuple(ids[:i])) == ids[i] for i in range(1, 4))

    runs = [Counter(follows(list(c.token_ids)) for c in llm.generate([{"prompt_token_ids": prompt}], params,
                                                                      use_tqdm=False)[0].outputs)
            for llm in (base, spec)]
    assert spec.llm_engine.spec_stats.num_accepted_tokens > 200
    assert len(runs[0]) > 3  # more than one outcome: the test compares distributions, not one sequence
    assert _chi_square_p(*runs) > 1e-3, runs


def test_a_draft_of_another_vocabulary_is_refused(target_and_draft, tmp_path):
    target, _ = target_and_draft
    hf = tiny_model("llama")
    hf.resize_token_embeddings(300)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    save_tiny_tokenizer(tmp_path, 300)
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(model=target, max_model_len=128, kv_cache_memory=0.05,
            speculative_config={"model": str(tmp_path), "num_speculative_tokens": 3})
