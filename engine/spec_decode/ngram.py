"""The n-gram proposer (vLLM's "ngram", prompt lookup): drafts copied from where the context repeats itself, for the
requests whose next token is a pure argmax (greedy, no penalty, bias or grammar), so checking them is exact."""
from __future__ import annotations

import numpy as np

from cpu_kernels.ngram import ngram_lookup
from engine.spec_decode.config import SpeculativeConfig


def speculable(params) -> bool:
    """Whether a request's tokens can be checked by argmax alone: greedy, one completion, nothing that changes a
    row's logits with the tokens before it (penalties, min_tokens) or that needs per-token extras (logprobs)."""
    return (params.temperature < 1e-5 and params.n == 1 and params.logprobs is None
            and params.structured_outputs is None and not params.logit_bias and params.min_tokens == 0
            and params.presence_penalty == 0 and params.frequency_penalty == 0 and params.repetition_penalty == 1)


class NgramProposer:
    def __init__(self, cfg: SpeculativeConfig):
        self.k, self.lo, self.hi = cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max

    def propose(self, token_ids: list[int], limit: int) -> list[int]:
        """Up to min(k, limit) tokens that followed the most recent earlier occurrence of the context's longest
        matching suffix (prompt_lookup_max down to prompt_lookup_min tokens); [] when nothing repeats."""
        k = min(self.k, limit)
        if k <= 0 or len(token_ids) <= self.lo:
            return []
        tokens = np.asarray(token_ids, np.int64)
        start, count = ngram_lookup(tokens, self.lo, self.hi, k)
        return tokens[start:start + count].tolist()
