"""The n-gram proposer (vLLM's "ngram", prompt lookup): drafts copied from where the context repeats itself."""
from __future__ import annotations

import numpy as np

from cpu_kernels import ngram
from cpu_kernels.ngram import ngram_lookup
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.proposer import Proposer


class NgramProposer(Proposer):
    def __init__(self, cfg: SpeculativeConfig):
        self.k, self.lo, self.hi = cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max

    def propose(self, rid, req, limit: int) -> list[int]:
        """Up to min(k, limit) tokens that followed the most recent earlier occurrence of the longest matching suffix
        of request req's context (prompt_lookup_max down to prompt_lookup_min tokens); [] when nothing repeats."""
        token_ids = req.all_token_ids
        k = min(self.k, limit)
        if k <= 0 or len(token_ids) <= self.lo:
            return []
        tokens = np.asarray(token_ids, np.int64)
        start, count = ngram_lookup(tokens, self.lo, self.hi, k)
        return tokens[start:start + count].tolist()

    def warm_up(self) -> None:
        ngram.warm_up()
