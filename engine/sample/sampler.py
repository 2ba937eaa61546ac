"""Batched sampler: logits (R, V) + each row's SamplingParams -> next token ids and logprobs.

Order of operations (vLLM's): logit_bias, min_tokens (EOS and stop ids masked), penalties
(repetition, then frequency, then presence), temperature, top_k, top_p, min_p, sample.
Greedy rows take the argmax after the penalties (temperature and truncation cannot move it).

Logprobs are computed from the raw logits: log_softmax before any bias, penalty or temperature,
as vLLM's default logprobs_mode 'raw_logprobs' does. So a returned logprob is the model's own
probability of the token, comparable across requests whatever their sampling settings.

Randomness: every random row consumes exactly one uniform per step, drawn from its own generator
when it has one (seeded request) or from the sampler's generator otherwise; the token is then the
inverse CDF of that uniform over the truncated distribution. A seeded row's tokens therefore do not
depend on what else is in the batch, and each row is computed alone (no cross-row reductions).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional, Sequence

import numpy as np

from engine.outputs import Logprob
from engine.sample.sampling import SamplingParams, SamplingType

# First candidate-set size tried when looking for the top_p nucleus without a full sort.
_NUCLEUS_PROBE = 1024


@dataclass
class SamplingRow:
    """What the sampler needs to know about one row of the logits.

    params: the request's SamplingParams.
    generator: the request's own generator (seeded requests), None to use the sampler's.
    prompt_token_ids: the prompt (for the repetition penalty).
    output_token_ids: tokens generated so far (penalties, min_tokens).
    """
    params: SamplingParams
    generator: Optional[np.random.Generator] = None
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()


class SamplerOutput(NamedTuple):
    token_ids: np.ndarray                            # (R,) int64
    logprobs: list[Optional[dict[int, Logprob]]]     # per row; None where params.logprobs is None


class Sampler:
    """Samples one token per row. Holds the engine-level generator for unseeded requests.

    Args:
        eos_token_ids: masked while a request is below min_tokens (unless it ignores EOS).
        seed: seed of the engine-level generator (None: from OS entropy).
    """

    def __init__(self, eos_token_ids: Iterable[int] = (), seed: Optional[int] = None):
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.generator = np.random.default_rng(seed)

    def sample(self, logits: np.ndarray, rows: Sequence[SamplingRow]) -> SamplerOutput:
        """logits f32 (R, V), rows: R SamplingRow -> SamplerOutput(token_ids (R,), logprobs)."""
        logits = np.asarray(logits, dtype=np.float32)
        num_rows, vocab_size = logits.shape
        if len(rows) != num_rows:
            raise ValueError(f"got {num_rows} rows of logits but {len(rows)} sampling rows")

        # One uniform per random row; unseeded rows share one vectorized draw.
        random_rows = [i for i, r in enumerate(rows) if r.params.sampling_type != SamplingType.GREEDY]
        uniforms = np.zeros(num_rows)
        unseeded = [i for i in random_rows if rows[i].generator is None]
        if unseeded:
            uniforms[unseeded] = self.generator.random(len(unseeded))
        for i in random_rows:
            if rows[i].generator is not None:
                uniforms[i] = rows[i].generator.random()

        token_ids = np.empty(num_rows, dtype=np.int64)
        logprobs: list[Optional[dict[int, Logprob]]] = []
        for i, row in enumerate(rows):
            p = row.params
            raw = logits[i]
            x = apply_logits_processors(raw, row, self.eos_token_ids)
            if p.sampling_type == SamplingType.GREEDY:
                token_ids[i] = int(np.argmax(x))
            else:
                token_ids[i] = _sample_random(x, p, uniforms[i], copied=x is not raw)
            logprobs.append(None if p.logprobs is None
                            else token_logprobs(raw, int(token_ids[i]), p.logprobs))
        return SamplerOutput(token_ids, logprobs)


def apply_logits_processors(x: np.ndarray, row: SamplingRow, eos_token_ids: Sequence[int]) -> np.ndarray:
    """logit_bias, min_tokens and penalties on one row x f32 (V,).

    Returns x itself when nothing applies, else a modified copy (x is never written).
    """
    p = row.params
    out = None
    vocab_size = x.shape[0]
    if p.logit_bias:
        out = x.copy()
        ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
        if ids.size and ids.max() >= vocab_size:
            raise ValueError(f"logit_bias token id {int(ids.max())} is out of vocab (size {vocab_size})")
        out[ids] += np.fromiter(p.logit_bias.values(), dtype=np.float32, count=len(p.logit_bias))
    if p.min_tokens and len(row.output_token_ids) < p.min_tokens:
        stop_ids = set(p.stop_token_ids)
        if not p.ignore_eos:
            stop_ids.update(eos_token_ids)
        stop_ids = [t for t in stop_ids if t < vocab_size]
        if stop_ids:
            out = x.copy() if out is None else out
            out[stop_ids] = -np.inf
    if p.repetition_penalty != 1.0 and (len(row.prompt_token_ids) or len(row.output_token_ids)):
        out = x.copy() if out is None else out
        seen = np.unique(np.concatenate([np.asarray(row.prompt_token_ids, dtype=np.int64),
                                         np.asarray(row.output_token_ids, dtype=np.int64)]))
        vals = out[seen]
        rp = np.float32(p.repetition_penalty)
        out[seen] = np.where(vals > 0, vals / rp, vals * rp)
    if (p.frequency_penalty or p.presence_penalty) and len(row.output_token_ids):
        out = x.copy() if out is None else out
        ids, counts = np.unique(np.asarray(row.output_token_ids, dtype=np.int64), return_counts=True)
        out[ids] -= (np.float32(p.frequency_penalty) * counts.astype(np.float32)
                     + np.float32(p.presence_penalty))
    return x if out is None else out


def _sample_random(x: np.ndarray, p: SamplingParams, u: float, copied: bool) -> int:
    """Temperature, top_k, top_p, min_p on one row x (V,), then the inverse CDF at u in [0, 1)."""
    weights, ids = truncated_distribution(x, p, copied)
    return inverse_cdf(weights, u, ids)


def truncated_distribution(x: np.ndarray, p: SamplingParams, copied: bool) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Temperature, top_k, top_p, min_p on one row x (V,) -> (weights, ids): the unnormalized probabilities of the
    tokens a random row may draw, over the whole vocabulary (ids None) or over the token ids `ids`. copied: x is the
    caller's own copy (scaled in place)."""
    if p.temperature != 1.0:
        if copied:
            x /= np.float32(p.temperature)
        else:
            x = x / np.float32(p.temperature)
    vocab_size = x.shape[0]
    top_k = p.top_k if 0 < p.top_k < vocab_size else 0
    m = x.max()
    if not np.isfinite(m):  # everything masked (or NaN logits): nothing sensible to draw from
        return np.ones(1), np.array([int(np.argmax(x))])

    if not top_k and p.top_p >= 1.0:
        # No truncation by rank: no sort at all. Relative probabilities exp(x - max) suffice.
        e = np.exp(x - m)
        if p.min_p > 0.0:
            e[e < np.float32(p.min_p)] = 0.0  # the top token's relative probability is 1
        return e, None

    if top_k:
        # Keep the k largest (and anything tied with the k-th, as vLLM does).
        kth = np.partition(x, vocab_size - top_k)[vocab_size - top_k]
        cand = np.flatnonzero(x >= kth)
        cand_e = np.exp(x[cand] - m)
        total = float(cand_e.sum(dtype=np.float64))   # top_p works on the top-k renormalized mass
    else:
        e = np.exp(x - m)
        total = float(e.sum(dtype=np.float64))
        cand = _nucleus_candidates(x, e, p.top_p * total)
        cand_e = e[cand]
    order = np.lexsort((cand, -cand_e))  # descending probability, ties by token id
    cand, cand_e = cand[order], cand_e[order]

    if p.top_p < 1.0:
        cum = np.cumsum(cand_e, dtype=np.float64)
        # Keep up to and including the first token at which the mass reaches top_p.
        keep = int(np.searchsorted(cum, p.top_p * total, side="left")) + 1
        cand, cand_e = cand[:keep], cand_e[:keep]
    if p.min_p > 0.0:
        cand_e = np.where(cand_e >= np.float32(p.min_p) * cand_e[0], cand_e, np.float32(0.0))
    return cand_e, cand


def _nucleus_candidates(x: np.ndarray, e: np.ndarray, mass: float) -> np.ndarray:
    """Token ids of a top set of x holding at least `mass` of e, found without a full sort when possible."""
    vocab_size = x.shape[0]
    k = _NUCLEUS_PROBE
    while k < vocab_size:
        cand = np.argpartition(x, vocab_size - k)[vocab_size - k:]
        if float(e[cand].sum(dtype=np.float64)) >= mass:
            return cand
        k *= 8
    return np.arange(vocab_size)


def inverse_cdf(weights: np.ndarray, u: float, ids: Optional[np.ndarray]) -> int:
    """Index (or ids[index]) drawn with probability proportional to weights, at uniform u."""
    cdf = np.cumsum(weights, dtype=np.float64)
    idx = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if idx >= len(weights) or weights[idx] == 0:  # u * total rounded up to total
        idx = int(np.flatnonzero(weights)[-1])
    return idx if ids is None else int(ids[idx])


def _log_normalizer(x: np.ndarray) -> float:
    """log(sum(exp(x))) of one row, stable."""
    m = float(x.max())
    return m + float(np.log(np.exp(x - m).sum(dtype=np.float64)))


def _topk_logprobs(x: np.ndarray, lse: float, k: int, token: Optional[int]) -> dict[int, Logprob]:
    """token (with its true 1-based rank) first, then the top-k of x, as token_id -> Logprob."""
    vocab_size = x.shape[0]
    k = min(k, vocab_size)
    result: dict[int, Logprob] = {}
    if token is not None:
        rank = int(np.count_nonzero(x > x[token])) + 1
        result[token] = Logprob(float(x[token]) - lse, rank)
    if k:
        top = np.argpartition(x, vocab_size - k)[vocab_size - k:]
        top = top[np.lexsort((top, -x[top]))]
        for r, t in enumerate(top.tolist(), start=1):
            result[t] = Logprob(float(x[t]) - lse, r)  # a token already present keeps its place
    return result


def token_logprobs(raw: np.ndarray, token: int, k: int) -> dict[int, Logprob]:
    return _topk_logprobs(raw, _log_normalizer(raw), k, token)


def prompt_logprobs_for(logits: np.ndarray, prompt_ids: Sequence[int], k: int,
                        start: int = 0) -> list[Optional[dict[int, Logprob]]]:
    """Prompt logprobs in vLLM's form, from the raw logits of prompt positions.

    Args:
        logits: f32 (N, V); row j is the model's output at prompt position start + j, so it
            scores prompt_ids[start + j + 1]. For a whole prompt of P tokens: N = P - 1, start = 0.
        prompt_ids: the whole prompt.
        k: top logprobs per position (params.prompt_logprobs).
        start: first position of this chunk (chunked prefill calls this once per chunk).
    Returns:
        a leading None when start == 0 (nothing scores the first token), then per row a dict
        token_id -> Logprob: the actual prompt token (with its true rank) and the top-k.
    """
    logits = np.asarray(logits, dtype=np.float32)
    out: list[Optional[dict[int, Logprob]]] = [None] if start == 0 else []
    for j in range(logits.shape[0]):
        x = logits[j]
        out.append(_topk_logprobs(x, _log_normalizer(x), k, int(prompt_ids[start + j + 1])))
    return out
