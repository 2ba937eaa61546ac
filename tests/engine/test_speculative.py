"""Speculative decoding (n-gram): greedy output token for token the same as without it, on gemma-3-270m and tiny
random models, with penalties, bias, logprobs and grammars; sampled output distributed as without it (engine level:
the rows' own check is tests/engine/test_spec_verify.py); stop strings, EOS and max_tokens inside accepted drafts; the
config's refusals; the n-gram lookup against a plain reference."""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from cpu_kernels.ngram import ngram_lookup
from engine import LLM, SamplingParams
from engine.spec_decode.config import SpeculativeConfig
from tests.engine.test_spec_verify import _chi_square_p
from tests.model.tiny_models import saved_tiny

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 6}
REPEAT = ("The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. Please repeat "
          "this sentence exactly three more times: The quick brown fox jumps over the lazy dog.")
PROMPTS = [REPEAT, "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
           "Copy the list: red, green, blue, red, green, blue, red,", "Hello"]


@pytest.fixture(scope="module")
def pair():
    kw = dict(max_model_len=512, kv_cache_memory=0.25)
    return LLM(**kw), LLM(speculative_config=NGRAM, **kw)


def _same(a, b):
    for x, y in zip(a, b):
        for p, q in zip(x.outputs, y.outputs):
            assert (list(p.token_ids), p.text, p.finish_reason, p.stop_reason) == \
                   (list(q.token_ids), q.text, q.finish_reason, q.stop_reason)


def test_greedy_output_is_the_same_token_for_token(pair):
    base, spec = pair
    params = SamplingParams(temperature=0, max_tokens=60)
    before = spec.llm_engine.spec_stats.num_accepted_tokens
    _same(base.generate(PROMPTS, params, use_tqdm=False), spec.generate(PROMPTS, params, use_tqdm=False))
    assert spec.llm_engine.spec_stats.num_accepted_tokens - before > 40  # drafts were taken, not just offered


def test_stops_inside_accepted_drafts_end_where_they_would(pair):
    base, spec = pair
    for params in [SamplingParams(temperature=0, max_tokens=60, stop=["lazy dog.\n\nThe quick"]),
                   SamplingParams(temperature=0, max_tokens=60, stop=["fox"], include_stop_str_in_output=True),
                   SamplingParams(temperature=0, max_tokens=23), SamplingParams(temperature=0, max_tokens=1)]:
        _same(base.generate([REPEAT], params, use_tqdm=False), spec.generate([REPEAT], params, use_tqdm=False))


def test_greedy_with_penalties_bias_logprobs_and_grammars_is_the_same(pair):
    """Every row of a check goes through the request's processors with the drafts before it in its history."""
    base, spec = pair
    params = [SamplingParams(temperature=0, max_tokens=30, repetition_penalty=1.3),
              SamplingParams(temperature=0, max_tokens=30, presence_penalty=0.8, frequency_penalty=0.3),
              SamplingParams(temperature=0, max_tokens=30, logit_bias={1437: 3.0}, min_tokens=25),
              SamplingParams(temperature=0, max_tokens=30, logprobs=2),
              SamplingParams(temperature=0, max_tokens=40, structured_outputs={"regex": r"( ?The quick brown fox)+"})]
    a, b, stats = [], [], spec.llm_engine.spec_stats
    accepted = stats.num_accepted_tokens
    for i, p in enumerate(params):  # one at a time: five decodes together would leave no rows for drafts
        drafted = stats.num_draft_tokens
        a += base.generate([REPEAT], p, use_tqdm=False)  # the same schedule (prefix-cache hits) in both engines
        b += spec.generate([REPEAT], p, use_tqdm=False)
        assert i < 2 or stats.num_draft_tokens - drafted > 3  # penalized outputs may not repeat themselves
    assert stats.num_accepted_tokens - accepted > 40
    _same(a, b)
    x, y = a[3].outputs[0], b[3].outputs[0]
    assert len(y.logprobs) == len(y.token_ids)
    for p, q in zip(x.logprobs, y.logprobs):
        assert p.keys() == q.keys() and all(p[t].rank == q[t].rank for t in p)
        assert [p[t].logprob for t in p] == pytest.approx([q[t].logprob for t in q], abs=1e-5)
    assert x.cumulative_logprob == pytest.approx(y.cumulative_logprob, abs=1e-4)


def test_logprobs_of_drafts_cut_by_a_stop_are_taken_back(pair):
    base, spec = pair
    params = SamplingParams(temperature=0, max_tokens=60, stop=["lazy"], logprobs=1)
    x, y = base.generate([REPEAT], params, use_tqdm=False)[0].outputs[0], \
        spec.generate([REPEAT], params, use_tqdm=False)[0].outputs[0]
    assert list(x.token_ids) == list(y.token_ids) and len(y.logprobs) == len(y.token_ids)
    assert x.cumulative_logprob == pytest.approx(y.cumulative_logprob, abs=1e-4)


def test_seeded_sampling_takes_drafts_and_is_reproducible(pair):
    _, spec = pair
    params = SamplingParams(temperature=0.3, seed=11, max_tokens=40)
    before = spec.llm_engine.spec_stats.num_accepted_tokens
    first = spec.generate([REPEAT], params, use_tqdm=False)[0].outputs[0]
    assert spec.llm_engine.spec_stats.num_accepted_tokens - before > 10
    assert list(spec.generate([REPEAT], params, use_tqdm=False)[0].outputs[0].token_ids) == list(first.token_ids)


@pytest.mark.parametrize("config", [NGRAM, SUFFIX], ids=["ngram", "suffix"])
def test_sampled_output_is_distributed_as_without_drafts(config, tmp_path):
    """n completions of a tiny random model whose likely tokens repeat the prompt (a logit bias), with and without
    drafts: how often they go on as the drafts do agrees (two-sample chi-square), and drafts were taken."""
    saved_tiny(tmp_path, "llama")
    kw = dict(model=str(tmp_path), max_model_len=128, kv_cache_memory=0.05, seed=0, max_num_seqs=2)  # rows to draft
    base, spec = LLM(**kw), LLM(speculative_config=config, **kw)
    prompt = base.get_tokenizer().encode("t5 t6 t7 t5 t6 t7 t5 t6 t7 t5")
    bias = {t: 5.0 for t in set(prompt[-3:])}
    params = SamplingParams(n=500, temperature=1.0, max_tokens=4, ignore_eos=True, logit_bias=bias)
    def follows(ids):  # where the completion goes on as a draft would (taking drafts too often inflates these)
        return tuple(_lookup_reference(prompt + ids[:i], 1, 3, 1) == ids[i:i + 1] for i in range(1, 4))

    runs = [Counter(follows(list(c.token_ids)) for c in llm.generate([{"prompt_token_ids": prompt}], params,
                                                               use_tqdm=False)[0].outputs) for llm in (base, spec)]
    assert spec.llm_engine.spec_stats.num_accepted_tokens > 100
    assert _chi_square_p(*runs) > 1e-3, runs


def test_suffix_drafts_are_exact(pair):
    base, _ = pair
    params = SamplingParams(temperature=0, max_tokens=48)
    spec = LLM(speculative_config=SUFFIX, max_model_len=512, kv_cache_memory=0.25)
    _same(base.generate(PROMPTS, params, use_tqdm=False), spec.generate(PROMPTS, params, use_tqdm=False))
    assert spec.llm_engine.spec_stats.num_accepted_tokens > 60


def test_suffix_drafts_learn_from_earlier_outputs(tmp_path):
    """A tiny random model's answer repeats nothing of its prompt; the second time the prompt runs, the tree of
    recent outputs drafts most of it (not with that tree turned off), and the answer stays the same."""
    saved_tiny(tmp_path, "llama")
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    accepted = []
    for cached in (10000, 0):
        llm = LLM(model=str(tmp_path), max_model_len=256, kv_cache_memory=0.05,
                  speculative_config={**SUFFIX, "suffix_decoding_max_cached_requests": cached})
        stats, runs = llm.llm_engine.spec_stats, []
        for _ in range(2):
            before = stats.num_accepted_tokens
            runs.append(llm.generate(["t1 t9 t33 t4"], params, use_tqdm=False))
            accepted.append(stats.num_accepted_tokens - before)
        _same(*runs)
    assert accepted[1] > 25 and max(accepted[0], accepted[2], accepted[3]) < 8, accepted


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_models_match(arch, tmp_path):
    saved_tiny(tmp_path, arch)
    words = " ".join(f"t{random.Random(i).randrange(2, 60)}" for i in range(12))
    prompts = [words + " " + words, "t5 t6 t7 t5 t6 t7 t5"]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    kw = dict(model=str(tmp_path), max_model_len=256, kv_cache_memory=0.05)
    _same(LLM(**kw).generate(prompts, params, use_tqdm=False),
          LLM(speculative_config=NGRAM, **kw).generate(prompts, params, use_tqdm=False))


@pytest.mark.parametrize("config", [NGRAM, SUFFIX], ids=["ngram", "suffix"])
def test_linear_attention_models_match(config, tmp_path):
    """qwen3.5's DeltaNet state cannot take back rejected drafts: a checking step snapshots it before the drafts, and
    after a rejection the state goes back and the accepted drafts run again; output as without drafts, alone and
    batched, with prefix-cache hits."""
    saved_tiny(tmp_path, "qwen35")
    words = " ".join(f"t{random.Random(i).randrange(2, 60)}" for i in range(12))
    prompts = [words + " " + words, "t5 t6 t7 t5 t6 t7 t5", words + " t9 " + words]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    kw = dict(model=str(tmp_path), max_model_len=256, kv_cache_memory=0.05)
    base, spec = LLM(**kw), LLM(speculative_config=config, **kw)
    for batch in (prompts, prompts[:1], prompts[2:]):
        _same(base.generate(batch, params, use_tqdm=False), spec.generate(batch, params, use_tqdm=False))
    stats = spec.llm_engine.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # both paths ran: all taken, and rolled back
    assert spec.llm_engine.kv_manager.states.num_available == base.llm_engine.kv_manager.states.num_available


@pytest.mark.parametrize("config, message", [
    ({"method": "eagle", "num_speculative_tokens": 4}, "'eagle' is not supported yet"),
    ({"method": "mtp", "num_speculative_tokens": 2, "model": "x"}, "for method 'mtp'"),
    ({"method": "draft_model", "num_speculative_tokens": 4}, "speculative_config.model .* is required"),
    ({"model": "/x", "num_speculative_tokens": 4, "draft_tensor_parallel_size": 1}, "for method 'draft_model'"),
    ({"method": "suffix", "suffix_decoding_max_tree_depth": 0}, "max_tree_depth=0 must be"),
    ({"method": "suffix", "suffix_decoding_max_cached_requests": -1}, "max_cached_requests=-1 must be"),
    ({"method": "suffix", "suffix_decoding_max_spec_factor": -0.5}, "max_spec_factor=-0.5 must be"),
    ({"method": "suffix", "suffix_decoding_min_token_prob": 1.5}, "min_token_prob=1.5 must be"),
    ({"method": "suffix", "prompt_lookup_max": 3}, "unknown or unsupported key"),
    ({"method": "medusa2", "num_speculative_tokens": 4}, "must be one of ngram"),
    ({"method": "ngram", "num_speculative_tokens": 0, "prompt_lookup_max": 3}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "prompt_lookup_min": 3}, "<="),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "model": "x"}, "unknown"),
])
def test_configs_it_cannot_honour_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict(config)


def test_suffix_defaults_as_in_vllm():
    cfg = SpeculativeConfig.from_dict({"method": "suffix"})
    assert (cfg.num_speculative_tokens, cfg.suffix_decoding_max_tree_depth, cfg.suffix_decoding_max_cached_requests,
            cfg.suffix_decoding_max_spec_factor, cfg.suffix_decoding_min_token_prob) == (24, 24, 10000, 1.0, 0.1)


def test_lookup_bounds_default_as_in_vllm():
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2})
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (5, 5)
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 2, "prompt_lookup_max": 3}).prompt_lookup_min == 3


def test_layers_on_a_device_are_refused():
    """torch's kernels give a row different bits in a k+1-row step than in a decode step: not exact there."""
    with pytest.raises(ValueError, match="layers on a GPU"):
        LLM(max_model_len=256, kv_cache_memory=0.1, n_gpu_layers="1", gpu_device="cpu", speculative_config=NGRAM)


def _lookup_reference(tokens, lo, hi, k):
    for n in range(min(hi, len(tokens) - 1), lo - 1, -1):
        suffix = tokens[-n:]
        for s in range(len(tokens) - n - 1, -1, -1):
            if tokens[s:s + n] == suffix:
                return tokens[s + n:s + n + k]
    return []


def test_ngram_lookup_matches_a_plain_search():
    rng = random.Random(0)
    for _ in range(500):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        lo = rng.randrange(1, 4)
        hi, k = lo + rng.randrange(3), rng.randrange(1, 6)
        start, count = ngram_lookup(np.array(tokens, np.int64), lo, hi, k)
        assert tokens[start:start + count] == _lookup_reference(tokens, lo, hi, k), (tokens, lo, hi, k)


def test_the_command_line_takes_the_config_as_json():
    import argparse

    from engine.args import EngineArgs
    ap = argparse.ArgumentParser()
    EngineArgs.add_cli_args(ap)
    ns = ap.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, '
                                                '"prompt_lookup_max": 2}'])
    assert EngineArgs.from_cli_args(ns).speculative_config["num_speculative_tokens"] == 3
    with pytest.raises(SystemExit):
        ap.parse_args(["--speculative-config", "[1, 2]"])


def test_a_completion_whose_check_fails_fails_its_request_alone(pair, monkeypatch):
    """n = 2 with drafts: when one completion's check raises, its request fails (both completions), and the other
    requests of the step go on as without speculation."""
    from engine.errors import RequestsFailed
    base, spec = pair
    engine, real = spec.llm_engine, spec.llm_engine.speculator.verify

    def verify(s, *args):
        if s.req_id.startswith("0_bad"):
            raise RuntimeError("injected")
        return real(s, *args)
    monkeypatch.setattr(engine.speculator, "verify", verify)
    params = SamplingParams(temperature=0, max_tokens=30)
    engine.add_request("bad", REPEAT, SamplingParams(n=2, temperature=0.7, seed=3, max_tokens=30))
    engine.add_request("good", REPEAT, params)
    failed, done = set(), {}
    while engine.has_unfinished_requests():
        try:
            outs = engine.step()
        except RequestsFailed as e:
            failed |= set(e.failures)
            outs = e.outputs
        done.update({o.request_id: o for o in outs if o.finished})
    assert failed == {"bad"} and "good" in done
    want = base.generate([REPEAT], params, use_tqdm=False)[0].outputs[0]
    assert list(done["good"].outputs[0].token_ids) == list(want.token_ids)
