"""The engine's speculative decoding: n-gram drafts for the running completions after a step, their check in the
next one, and each completion's draft length adapted to what it accepted."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from cpu_kernels import ngram
from engine.sample.sampler import SamplingRow
from engine.spec_decode.config import SPEC_STEP_ROWS, SpeculativeConfig
from engine.spec_decode.ngram import NgramProposer
from engine.spec_decode.stats import SpecStats
from engine.spec_decode.verify import Verified, verify_drafts


class Speculator:
    def __init__(self, cfg: SpeculativeConfig):
        self.cfg = cfg
        self.proposer = NgramProposer(cfg)
        self.stats = SpecStats(cfg.num_speculative_tokens)
        self._draft_len: dict[str, int] = {}  # per completion: drafts to propose next, adapted to its acceptance

    @classmethod
    def build(cls, config: Optional[dict], model, runner) -> Optional["Speculator"]:
        """None without a speculative_config; ValueError for a model it cannot be exact on."""
        cfg = SpeculativeConfig.from_dict(config)
        if cfg is None:
            return None
        placement = getattr(model, "placement", None)
        if placement is not None and placement.uses_gpu():
            raise ValueError("speculative decoding with layers on a GPU is not supported yet (torch's kernels do not "
                             "give a row the same bits in a k+1-row step as in a decode step)")
        if runner.num_state_slots:
            raise ValueError("speculative decoding is not supported for models with linear-attention layers yet (their "
                             "state cannot take back rejected drafts)")
        return cls(cfg)

    def warm_up(self) -> None:
        ngram.warm_up()

    def propose(self, completions, num_running: int, max_model_len: int) -> None:
        """Drafts for the next step of each (request id, ChildState) that is running; none while the running
        requests alone fill a step's rows (the scheduler would drop them)."""
        if num_running >= SPEC_STEP_ROWS:
            return
        for rid, child in completions:
            if child.finish_reason is not None:
                continue
            req = child.request
            # each accepted draft is an output token, and one more comes after them; all within the context
            room = min(req.max_tokens - req.num_output_tokens - 1, max_model_len - req.num_tokens,
                       self._draft_len.get(rid, self.cfg.num_speculative_tokens))
            req.spec_token_ids = self.proposer.propose(req.all_token_ids, room)

    def verify(self, s, hidden_rows: np.ndarray, compute_logits: Callable, child, generator, eos_token_ids,
               mask: Callable) -> Verified:
        """A completion's drafts (scheduled entry s, ChildState child) checked by the rows of its last token and of
        each draft; generator: the one its random rows draw from."""
        k = len(s.spec_token_ids)
        logits = compute_logits(hidden_rows[-(k + 1):], per_row=True)  # each row as a decode step's
        req = child.request
        row = SamplingRow(child.params, None, req.prompt_token_ids, req.output_token_ids)
        v = verify_drafts(logits, s.spec_token_ids, row, eos_token_ids, generator, child.grammar, mask)
        accepted = next((i for i, (t, d) in enumerate(zip(v.tokens, s.spec_token_ids)) if t != d), min(len(v.tokens), k))
        self.stats.record(k, accepted)
        # all taken: one more next time; else as many as were taken and one (rows of rejected drafts cost a step)
        grown = max(k, self._draft_len.get(s.req_id, 0)) + 1  # k may have been cut by the row budget or the match
        self._draft_len[s.req_id] = min(self.cfg.num_speculative_tokens, grown if accepted == k else accepted + 1)
        return v

    def forget(self, rid: str) -> None:
        self._draft_len.pop(rid, None)
