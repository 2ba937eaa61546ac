"""Checking drafts against the target model, row by row as k + 1 decode steps would take them: each row's logits go
through the request's grammar, its processors (penalties and min_tokens see the drafts before it) and its
truncation. A greedy row keeps a draft its argmax agrees with; a random row keeps draft d with probability p(d) and
else draws from p without d (rejection sampling with a point-mass proposal, so the output follows the target
distribution exactly). The first rejected row gives its own token instead; a row after the last draft gives a bonus
token."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from engine.sample.sampler import (SamplingRow, apply_logits_processors, inverse_cdf, token_logprobs,
                                   truncated_distribution)
from engine.sample.sampling import SamplingType


@dataclass
class Verified:
    tokens: list[int] = field(default_factory=list)  # the drafts kept, then one token of the rows' own
    logprobs: list = field(default_factory=list)  # per token, the target model's, when the request asks for them
    ended: bool = False  # the grammar accepted nothing more before the first row: no token at all


def verify_drafts(logits: np.ndarray, drafts: Sequence[int], row: SamplingRow, eos_token_ids: Sequence[int],
                  generator: np.random.Generator, grammar=None, mask: Optional[Callable] = None) -> Verified:
    """logits f32 (k + 1, V), changed in place: the rows of the last sampled token and of each of the k drafts.

    row: the request's sampling row before this step (its output tokens so far); generator: the row's own (seeded
    requests) or the sampler's; grammar/mask: the request's matcher and StructuredOutputs.mask, or None."""
    p, out = row.params, Verified()
    outputs = list(row.output_token_ids)
    for i in range(len(drafts) + 1):
        raw = logits[i]
        if grammar is not None:
            ok = mask(logits[i:i + 1], [0], [grammar])[0]
            if isinstance(ok, Exception):
                raise ok
            if ok is False:  # the grammar has ended: the tokens so far are the output, the next step ends it
                out.ended = not out.tokens
                return out
        x = apply_logits_processors(raw, SamplingRow(p, None, row.prompt_token_ids, outputs), eos_token_ids)
        if p.sampling_type == SamplingType.GREEDY:
            token = int(np.argmax(x))
        else:
            weights, ids = truncated_distribution(x, p, copied=x is not raw)
            token = (_keep_or_resample(weights, ids, int(drafts[i]), generator) if i < len(drafts)
                     else inverse_cdf(weights, generator.random(), ids))
        if grammar is not None and not grammar.accept(token):  # as the plain path: the request ends here
            out.ended = not out.tokens
            return out
        out.tokens.append(token)
        outputs.append(token)
        if p.logprobs is not None:
            out.logprobs.append(token_logprobs(raw, token, p.logprobs))
        if i == len(drafts) or token != drafts[i]:
            return out
    return out


def _keep_or_resample(weights: np.ndarray, ids: Optional[np.ndarray], draft: int,
                      generator: np.random.Generator) -> int:
    """The draft with probability p(draft) = its weight over the total; else a token drawn from p without it."""
    at = np.flatnonzero(ids == draft) if ids is not None else ([draft] if draft < weights.shape[0] else [])
    p_draft = float(weights[at[0]]) if len(at) else 0.0
    total = float(weights.sum(dtype=np.float64))
    if generator.random() * total < p_draft:
        return draft
    if len(at):
        weights = weights.copy()
        weights[at[0]] = 0.0
        if not weights.any():  # p(draft) rounded to just under 1: nothing else to draw
            return draft
    return inverse_cdf(weights, generator.random(), ids)
