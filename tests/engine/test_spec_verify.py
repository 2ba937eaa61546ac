"""Draft checking (engine/spec_decode/verify.py) against plain decoding with the engine's own sampler: greedy rows give
the tokens k + 1 decode steps would; random rows give sequences distributed as plain sampling gives them (two-sample
chi-square over the outcomes), under temperature, top-k, top-p, min-p, penalties and logit bias; logprobs are the
target rows'."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from engine.sample.sampler import Sampler, SamplingRow
from engine.sample.sampling import SamplingParams
from engine.spec_decode.verify import verify_drafts

V = 8
EOS = (V - 1,)


def _rows(seed: int, k: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.5, (k + 1, V)).astype(np.float32)


def _plain(logits, drafts, params, outputs, sampler):
    """What decode steps give, one row at a time: each row's token from the sampler, until it leaves the drafts."""
    tokens = []
    for i in range(len(drafts) + 1):
        t = int(sampler.sample(logits[i:i + 1].copy(), [SamplingRow(params, None, [1, 2], outputs + tokens)])
                .token_ids[0])
        tokens.append(t)
        if i == len(drafts) or t != drafts[i]:
            return tuple(tokens)


def _chi_square_p(a: Counter, b: Counter) -> float:
    """p-value of 'a and b are draws from one distribution' (two-sample chi-square, outcomes seen < 5 times pooled)."""
    na, nb = sum(a.values()), sum(b.values())
    keys = sorted(set(a) | set(b), key=lambda x: -(a[x] + b[x]))
    big = [x for x in keys if a[x] + b[x] >= 5]
    rest_a, rest_b = na - sum(a[x] for x in big), nb - sum(b[x] for x in big)
    cells = [(a[x], b[x]) for x in big] + ([(rest_a, rest_b)] if rest_a + rest_b else [])
    stat = 0.0
    for ca, cb in cells:
        ea, eb = (ca + cb) * na / (na + nb), (ca + cb) * nb / (na + nb)
        stat += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    df = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_greedy_rows_give_what_decode_steps_give():
    sampler = Sampler(EOS, seed=0)
    for seed in range(40):
        logits = _rows(seed, 4)
        params = SamplingParams(temperature=0, max_tokens=99, repetition_penalty=1.0 + (seed % 3) * 0.4,
                                presence_penalty=(seed % 2) * 1.5, logit_bias={3: 0.5} if seed % 5 == 0 else None,
                                min_tokens=seed % 4)
        best = [int(np.argmax(r)) for r in logits]
        drafts = best[:seed % 5] + [(best[seed % 5] + 1) % V] * (4 - seed % 5)  # agree, then disagree
        outputs = [seed % V, (seed + 3) % V]
        want = _plain(logits, drafts, params, outputs, sampler)
        got = verify_drafts(logits.copy(), drafts, SamplingRow(params, None, [1, 2], outputs), EOS,
                            np.random.default_rng(0))
        assert tuple(got.tokens) == want


CASES = [dict(temperature=1.0), dict(temperature=0.6), dict(temperature=1.2, top_k=4),
         dict(temperature=1.0, top_p=0.7), dict(temperature=0.9, min_p=0.15),
         dict(temperature=1.0, presence_penalty=1.2, frequency_penalty=0.4, repetition_penalty=1.3),
         dict(temperature=1.0, logit_bias={5: 2.0}, min_tokens=5)]


@pytest.mark.parametrize("kw", CASES, ids=[",".join(k for k in c) + f"-{i}" for i, c in enumerate(CASES)])
def test_random_rows_follow_the_target_distribution(kw):
    params = SamplingParams(max_tokens=99, **kw)
    logits, outputs = _rows(7, 3), [5, 2]
    order = np.argsort(-logits, axis=1)
    drafts = [int(order[0, 1]), int(order[1, 0]), int(order[2, 2])]  # likely but not certain: both branches run
    trials, sampler = 12000, Sampler(EOS, seed=1)
    plain = Counter(_plain(logits, drafts, params, outputs, sampler) for _ in range(trials))
    gen, row = np.random.default_rng(2), SamplingRow(params, None, [1, 2], outputs)
    spec = Counter(tuple(verify_drafts(logits.copy(), drafts, row, EOS, gen).tokens) for _ in range(trials))
    assert sum(n for t, n in spec.items() if len(t) == 1) > trials // 20  # rejections happen ...
    assert sum(n for t, n in spec.items() if len(t) > 1) > trials // 20  # ... and acceptances
    assert _chi_square_p(plain, spec) > 1e-3, (sorted(plain.items()), sorted(spec.items()))


def test_a_biased_check_is_caught():
    """The test's own power: a check that takes the draft half the time whatever its probability is told apart."""
    params = SamplingParams(temperature=1.0, max_tokens=99)
    logits = _rows(7, 1)
    draft = [int(np.argsort(-logits[0])[1])]
    sampler, gen = Sampler(EOS, seed=1), np.random.default_rng(2)
    row = SamplingRow(params, None, [1, 2], [])

    def biased():
        if gen.random() < 0.5:  # the draft kept, then the bonus row's own token
            return tuple(draft) + _plain(logits[1:], [], params, draft, sampler)
        return tuple(verify_drafts(logits.copy(), draft, row, EOS, gen).tokens)

    plain = Counter(_plain(logits, draft, params, [], sampler) for _ in range(4000))
    assert _chi_square_p(plain, Counter(biased() for _ in range(4000))) < 1e-6


def test_logprobs_are_the_target_rows():
    params = SamplingParams(temperature=0, max_tokens=99, logprobs=2)
    logits = _rows(3, 2)
    drafts = [int(np.argmax(logits[0])), int(np.argmax(logits[1]))]
    got = verify_drafts(logits.copy(), drafts, SamplingRow(params, None, [1], []), EOS, np.random.default_rng(0))
    assert len(got.tokens) == len(got.logprobs) == 3
    for i, (t, lp) in enumerate(zip(got.tokens, got.logprobs)):
        x = logits[i].astype(np.float64)
        assert lp[t].logprob == pytest.approx(x[t] - np.log(np.exp(x).sum()), abs=1e-5)
        assert lp[t].rank == 1 and len(lp) == 2
