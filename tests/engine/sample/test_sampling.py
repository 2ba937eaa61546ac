"""SamplingParams validation and the batched sampler (engine/sample/sampling.py, engine/sample/sampler.py)."""
import math

import numpy as np
import pytest

from engine.outputs import CompletionOutput, Logprob, RequestOutput
from engine.sample.sampler import Sampler, SamplingRow, apply_logits_processors, prompt_logprobs_for
from engine.sample.sampling import RequestOutputKind, SamplingParams, SamplingType


def _log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


class FixedUniform:
    """A stand-in generator whose random() returns preset values: pins the sampler's one draw."""

    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


# ---- SamplingParams -----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(n=0), "n must be at least 1"),
    (dict(n=2, best_of=1), "best_of must equal n"),
    (dict(n=2, best_of=3), "best_of must equal n"),
    (dict(n=16385), "n must be at most 16384, got 16385. To increase this limit, set the RAMLM_MAX_N_SEQUENCES"),
    (dict(seed=-2), "seed must be -1 (no seed) or an integer in [0, 2**64 - 1], got -2"),
    (dict(seed=2**64), "seed must be -1 (no seed) or an integer in [0, 2**64 - 1]"),
    (dict(seed=1.5), "seed must be -1 (no seed) or an integer"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty must be a finite number"),
    (dict(repetition_penalty=float("nan")), "repetition_penalty must be a finite number"),
    (dict(presence_penalty=float("nan")), "presence_penalty must be in [-2, 2]"),
    (dict(frequency_penalty=float("inf")), "frequency_penalty must be in [-2, 2]"),
    (dict(temperature=float("inf")), "temperature must be finite"),
    (dict(top_p=float("nan")), "top_p must be in (0, 1]"),
    (dict(min_p=float("nan")), "min_p must be in [0, 1]"),
    (dict(logit_bias={1: float("nan")}), "logit_bias needs"),
    (dict(logit_bias={"one": 1.0}), "logit_bias keys must be token ids"),
    (dict(presence_penalty=2.5), "presence_penalty must be in [-2, 2]"),
    (dict(frequency_penalty=-2.1), "frequency_penalty must be in [-2, 2]"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be greater than zero"),
    (dict(temperature=-0.1), "temperature must be non-negative"),
    (dict(temperature=float("nan")), "temperature must be non-negative"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p must be in (0, 1]"),
    (dict(top_k=-2), "top_k must be 0 or -1 (disable), or at least 1"),
    (dict(top_k=2.5), "top_k must be an integer"),
    (dict(min_p=-0.1), "min_p must be in [0, 1]"),
    (dict(min_p=1.1), "min_p must be in [0, 1]"),
    (dict(max_tokens=0), "max_tokens must be at least 1"),
    (dict(min_tokens=-1), "min_tokens must be greater than or equal to 0"),
    (dict(max_tokens=4, min_tokens=5), "min_tokens must be less than or equal to max_tokens=4"),
    (dict(logprobs=-1), "logprobs must be non-negative"),
    (dict(prompt_logprobs=-1), "prompt_logprobs must be non-negative"),
    (dict(stop=["a", ""]), "stop cannot contain an empty string"),
    (dict(stop="x", detokenize=False), "stop strings are only supported when detokenize is True"),
    (dict(stop_token_ids=[-3]), "stop_token_ids must be non-negative"),
    (dict(logit_bias={1: float("inf")}), "logit_bias needs"),
    (dict(temperature=0.0, n=2), "n must be 1 when using greedy sampling"),
])
def test_validation_errors(kwargs, message):
    with pytest.raises(ValueError) as e:
        SamplingParams(**kwargs)
    assert message in str(e.value)


def test_defaults_and_normalization():
    p = SamplingParams()
    assert (p.n, p.best_of, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.prompt_logprobs, p.seed) == (16, 0, None, None, None)
    assert p.stop == [] and p.stop_token_ids == [] and p.logit_bias is None
    assert p.skip_special_tokens and p.spaces_between_special_tokens and p.detokenize
    assert not p.ignore_eos and not p.include_stop_str_in_output
    assert p.output_kind == RequestOutputKind.CUMULATIVE
    assert p.sampling_type == SamplingType.RANDOM

    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "bcd")).output_text_buffer_length == 2
    assert SamplingParams(stop="abc", include_stop_str_in_output=True).output_text_buffer_length == 0
    assert SamplingParams(logit_bias={"5": 1}).logit_bias == {5: 1.0}
    assert SamplingParams(seed=-1).seed is None
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1 and SamplingParams(seed=np.int64(7)).seed == 7
    assert SamplingParams(n=3, best_of=3).best_of == 3 and SamplingParams(n=16384).n == 16384
    assert SamplingParams(seed=2**64 - 1, n=2).child_seed(1) == 0 and SamplingParams(n=2).child_seed(1) is None
    assert SamplingParams(seed=3).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(max_tokens=None).max_tokens is None

    g = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2, seed=1)
    assert g.sampling_type == SamplingType.GREEDY
    assert (g.top_p, g.top_k, g.min_p) == (1.0, 0, 0.0)
    c = g.clone()
    assert c == g and c is not g
    with pytest.raises(ValueError, match="out-of-vocab"):
        SamplingParams(logit_bias={10: 1.0}).verify_token_ids(10)
    SamplingParams(logit_bias={9: 1.0}, stop_token_ids=[9]).verify_token_ids(10)
    with pytest.raises(ValueError, match=r"top_k cannot be greater than vocabulary size \(10\), but got 11"):
        SamplingParams(top_k=11).verify_token_ids(10)
    SamplingParams(top_k=10).verify_token_ids(10)


def test_output_types_are_vllm_shaped():
    lp = Logprob(-0.5)
    assert (lp.logprob, lp.rank, lp.decoded_token) == (-0.5, None, None)
    c = CompletionOutput(0, "hi", [1, 2], None, None)
    assert not c.finished() and c.stop_reason is None
    r = RequestOutput("r0", "p", [5], None, [c], False, num_cached_tokens=0)
    r.add(RequestOutput("r0", "p", [5], None, [CompletionOutput(0, "!", [3], None, None, "stop")], True),
          aggregate=True)
    assert r.finished and r.outputs[0].text == "hi!" and r.outputs[0].token_ids == [1, 2, 3]
    assert r.outputs[0].finish_reason == "stop" and r.metrics is None


# ---- Sampler: greedy and truncation ---------------------------------------------------------

def _rows(params, n, **kw):
    return [SamplingRow(params, **kw) for _ in range(n)]


def test_greedy_is_argmax():
    logits = np.random.default_rng(0).standard_normal((6, 5000)).astype(np.float32)
    out = Sampler(seed=0).sample(logits, _rows(SamplingParams(temperature=0.0), 6))
    assert out.token_ids.dtype == np.int64
    np.testing.assert_array_equal(out.token_ids, logits.argmax(axis=1))
    assert out.logprobs == [None] * 6


@pytest.mark.parametrize("params", [
    SamplingParams(top_k=1),
    SamplingParams(top_p=1e-6),
    SamplingParams(top_p=1e-6, temperature=3.0),
    SamplingParams(min_p=1.0),
    SamplingParams(top_k=50, top_p=1e-6, seed=3),
])
def test_degenerate_truncation_is_greedy(params):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((8, 3000)).astype(np.float32)
    sampler = Sampler(seed=0)
    for _ in range(3):
        rows = _rows(params, 8) if params.seed is None else [
            SamplingRow(params, np.random.default_rng(params.seed)) for _ in range(8)]
        np.testing.assert_array_equal(sampler.sample(logits, rows).token_ids, logits.argmax(axis=1))


def _reference_sample(x, p, u):
    """Full-sort reference of temperature, top_k, top_p, min_p and the inverse CDF at u.

    The inverse CDF runs over tokens by descending probability when top_k/top_p truncate, and in
    token-id order otherwise (the sampler then skips the sort); either is a valid draw.
    """
    x = np.asarray(x, dtype=np.float64) / p.temperature
    if p.top_k or p.top_p < 1.0:
        order = np.lexsort((np.arange(x.size), -x))  # descending, ties by id
    else:
        order = np.arange(x.size)
    probs = np.exp(x[order] - x.max())
    if p.top_k:
        kth = x[order][p.top_k - 1]
        probs = np.where(x[order] >= kth, probs, 0.0)
    probs = probs / probs.sum()
    if p.top_p < 1.0:
        cum_before = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
        probs = np.where(cum_before < p.top_p, probs, 0.0)
    if p.min_p:
        probs = np.where(probs >= p.min_p * probs.max(), probs, 0.0)
    cdf = np.cumsum(probs)
    return int(order[np.searchsorted(cdf, u * cdf[-1], side="right")])


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8),
    SamplingParams(top_k=7),
    SamplingParams(top_p=0.6),
    SamplingParams(top_p=0.97, temperature=2.0),   # nucleus wider than the first probe
    SamplingParams(top_k=40, top_p=0.5),
    SamplingParams(min_p=0.3, temperature=0.5),
    SamplingParams(top_k=100, top_p=0.9, min_p=0.05),
])
def test_truncation_matches_full_sort_reference(params):
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((1, 20000)) * 2).astype(np.float32)
    sampler = Sampler()
    mismatches = []
    for u in np.linspace(0.0, 0.999, 41):
        got = sampler.sample(logits, [SamplingRow(params, FixedUniform(float(u)))]).token_ids[0]
        want = _reference_sample(logits[0], params, float(u))
        if got != want:
            mismatches.append((float(u), int(got), want))
    # f32 vs f64 cumulative sums may disagree only when u lands on a CDF boundary.
    assert len(mismatches) <= 1, mismatches


def test_min_p_keeps_only_tokens_above_threshold():
    # probs proportional to 8, 4, 2, 1: min_p=0.3 keeps the first two only.
    logits = np.log(np.array([[8.0, 4.0, 2.0, 1.0]], dtype=np.float32))
    sampler = Sampler(seed=0)
    seen = {int(sampler.sample(logits, [SamplingRow(SamplingParams(min_p=0.3))]).token_ids[0])
            for _ in range(300)}
    assert seen == {0, 1}


def test_temperature_sampling_matches_softmax():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(8).astype(np.float32) * 1.5
    params = SamplingParams(temperature=0.7)
    n = 4000
    out = Sampler(seed=1234).sample(np.tile(logits, (n, 1)), _rows(params, n))
    counts = np.bincount(out.token_ids, minlength=8)
    expected = n * np.exp(_log_softmax(logits / 0.7))
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 30.0, (counts, expected)   # 7 dof: p ~ 1e-4


def test_top_k_sampling_renormalizes():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1], dtype=np.float32))
    n = 3000
    out = Sampler(seed=7).sample(np.tile(logits, (n, 1)), _rows(SamplingParams(top_k=2), n))
    counts = np.bincount(out.token_ids, minlength=4)
    assert counts[2] == counts[3] == 0
    assert abs(counts[0] / n - 4 / 7) < 0.04


# ---- Sampler: logits processors -----------------------------------------------------------

def test_penalties_exact():
    x = np.array([2.0, -1.0, 0.5, -3.0, 1.0], dtype=np.float32)
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    row = SamplingRow(params, prompt_token_ids=[0, 1], output_token_ids=[2, 2, 3])
    got = apply_logits_processors(x, row, eos_token_ids=())
    # repetition on {0,1,2,3}: 2/2, -1*2, 0.5/2, -3*2; then output counts {2: 2, 3: 1}:
    # token 2: 0.25 - 2*0.5 - 0.25; token 3: -6 - 0.5 - 0.25.
    np.testing.assert_allclose(got, [1.0, -2.0, -1.0, -6.75, 1.0], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(x, [2.0, -1.0, 0.5, -3.0, 1.0])   # input untouched
    assert apply_logits_processors(x, SamplingRow(SamplingParams()), ()) is x


def test_penalties_change_greedy_choice():
    logits = np.array([[3.0, 2.9, 0.0]], dtype=np.float32)
    params = SamplingParams(temperature=0.0, repetition_penalty=1.5)
    assert Sampler().sample(logits, [SamplingRow(params, prompt_token_ids=[0])]).token_ids[0] == 1


def test_logit_bias_forces_token():
    logits = np.random.default_rng(4).standard_normal((2, 1000)).astype(np.float32)
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, logit_bias={123: 100.0, 0: -100.0})
        assert Sampler(seed=0).sample(logits, _rows(params, 2)).token_ids.tolist() == [123, 123]


def test_min_tokens_masks_eos_and_stop_ids():
    logits = np.array([[0.0, 5.0, 4.0, 1.0]], dtype=np.float32)   # EOS=1 best, stop id 2 next
    sampler = Sampler(eos_token_ids=[1])
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[2])
    assert sampler.sample(logits, [SamplingRow(params, output_token_ids=[0])]).token_ids[0] == 3
    assert sampler.sample(logits, [SamplingRow(params, output_token_ids=[0, 0])]).token_ids[0] == 1
    ignore = SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=True)
    assert sampler.sample(logits, [SamplingRow(ignore, output_token_ids=[])]).token_ids[0] == 1


# ---- Sampler: seeds --------------------------------------------------------------------------

def test_seeded_rows_do_not_depend_on_the_batch():
    rng = np.random.default_rng(5)
    vocab, steps = 500, 6
    logits = {name: (rng.standard_normal((steps, vocab)) * 2).astype(np.float32)
              for name in ("a", "b", "c", "d")}
    params = {"a": SamplingParams(seed=11, top_p=0.9), "b": SamplingParams(seed=22, top_k=20),
              "c": SamplingParams(), "d": SamplingParams(temperature=0.0)}

    def run(names, sampler_seed, params=params):
        sampler = Sampler(seed=sampler_seed)
        gens = {n: params[n].make_generator() for n in names}
        got = {n: [] for n in names}
        for step in range(steps):
            rows = [SamplingRow(params[n], gens[n], output_token_ids=got[n]) for n in names]
            out = sampler.sample(np.stack([logits[n][step] for n in names]), rows)
            for n, t in zip(names, out.token_ids.tolist()):
                got[n].append(t)
        return got

    alone_a, alone_b = run(["a"], 0)["a"], run(["b"], 0)["b"]
    for names, seed in ((["c", "a", "d", "b"], 1), (["b", "d", "c", "a"], 2), (["a", "b"], 3)):
        got = run(names, seed)
        assert got["a"] == alone_a and got["b"] == alone_b
    reseeded = dict(params, a=SamplingParams(seed=12, top_p=0.9))
    assert run(["a"], 0, reseeded)["a"] != alone_a   # the seed does matter


def test_unseeded_sampler_is_reproducible_with_engine_seed():
    logits = np.random.default_rng(6).standard_normal((4, 300)).astype(np.float32)
    rows = _rows(SamplingParams(), 4)
    assert (Sampler(seed=5).sample(logits, rows).token_ids.tolist()
            == Sampler(seed=5).sample(logits, rows).token_ids.tolist())


# ---- logprobs ------------------------------------------------------------------------------

def test_sample_logprobs_are_raw_log_softmax():
    rng = np.random.default_rng(8)
    logits = rng.standard_normal((3, 2000)).astype(np.float32)
    params = [SamplingParams(logprobs=5, temperature=0.5, repetition_penalty=1.3),
              SamplingParams(logprobs=0, temperature=0.0),
              SamplingParams()]
    rows = [SamplingRow(p, prompt_token_ids=[1, 2, 3]) for p in params]
    out = Sampler(seed=0).sample(logits, rows)
    ref = _log_softmax(logits)
    for i in (0, 1):
        d = out.logprobs[i]
        tok = int(out.token_ids[i])
        assert next(iter(d)) == tok                       # sampled token first
        order = np.argsort(-ref[i])
        rank = int(np.nonzero(order == tok)[0][0]) + 1
        assert d[tok].rank == rank and d[tok].decoded_token is None
        assert math.isclose(d[tok].logprob, ref[i][tok], abs_tol=1e-5)
        k = params[i].logprobs
        assert set(d) == set(order[:k].tolist()) | {tok}
        for r, t in enumerate(order[:k].tolist(), start=1):
            assert d[t].rank == r
        for t, lp in d.items():
            assert math.isclose(lp.logprob, ref[i][t], abs_tol=1e-5)
    assert list(out.logprobs[1]) == [int(np.argmax(logits[1]))]
    assert out.logprobs[1][int(np.argmax(logits[1]))].rank == 1
    assert out.logprobs[2] is None


def test_prompt_logprobs_form():
    rng = np.random.default_rng(9)
    prompt = [5, 17, 3, 42, 8]
    logits = rng.standard_normal((len(prompt) - 1, 50)).astype(np.float32)
    got = prompt_logprobs_for(logits, prompt, k=3)
    ref = _log_softmax(logits)
    assert len(got) == len(prompt) and got[0] is None
    for j, d in enumerate(got[1:]):
        target = prompt[j + 1]
        assert next(iter(d)) == target
        order = np.argsort(-ref[j])
        assert d[target].rank == int(np.nonzero(order == target)[0][0]) + 1
        for r, t in enumerate(order[:3].tolist(), start=1):
            assert d[t].rank == r and math.isclose(d[t].logprob, ref[j][t], abs_tol=1e-5)
        assert set(d) == set(order[:3].tolist()) | {target}
        assert math.isclose(d[target].logprob, ref[j][target], abs_tol=1e-5)
    # Chunked: positions 2.. give the same entries without the leading None.
    assert prompt_logprobs_for(logits[2:], prompt, k=3, start=2) == got[3:]
    assert all(set(d) == {prompt[j + 1]} for j, d in enumerate(prompt_logprobs_for(logits, prompt, 0)[1:]))
