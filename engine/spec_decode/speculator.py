"""The engine's speculative decoding: drafts (n-gram, suffix, a draft model's or an MTP layer's) for the running
completions after a step, their check in the next one, and each completion's draft length adapted to what it
accepted."""
from __future__ import annotations

import logging
from typing import Callable, Optional

import numpy as np

from engine.sample.sampler import SamplingRow
from engine.spec_decode.config import SPEC_STEP_ROWS, SpeculativeConfig
from engine.spec_decode.ngram import NgramProposer
from engine.spec_decode.suffix import SuffixProposer
from engine.spec_decode.stats import SpecStats
from engine.spec_decode.verify import Verified, verify_drafts

logger = logging.getLogger("ramlm.spec_decode")


class Speculator:
    def __init__(self, cfg: SpeculativeConfig, proposer):
        self.cfg = cfg
        self.proposer = proposer
        self.stats = SpecStats(cfg.num_speculative_tokens)
        self._draft_len: dict[str, int] = {}  # per completion: drafts to propose next, adapted to its acceptance

    @classmethod
    def build(cls, config: Optional[dict], model, runner, args, model_config) -> Optional["Speculator"]:
        """None without a speculative_config; ValueError for a model it cannot be exact on. args, model_config: the
        target's (a draft model is loaded as it was)."""
        cfg = SpeculativeConfig.from_dict(config)
        if cfg is None:
            return None
        placement = getattr(model, "placement", None)
        if placement is not None and placement.uses_gpu():
            raise ValueError("speculative decoding with layers on a GPU is not supported yet (torch's kernels do not "
                             "give a row the same bits in a k+1-row step as in a decode step)")
        if cfg.method == "draft_model":
            from engine.spec_decode.draft_model import DraftModelProposer
            return cls(cfg, DraftModelProposer(cfg, args, model_config, min(runner.group_num_blocks)))
        if cfg.method == "mtp":
            from engine.spec_decode.mtp import MtpProposer
            return cls(cfg, MtpProposer(cfg, model, runner.num_blocks, runner.block_size, args.kv_cache_dtype))
        return cls(cfg, NgramProposer(cfg) if cfg.method == "ngram" else SuffixProposer(cfg))

    def warm_up(self) -> None:
        self.proposer.warm_up()

    @property
    def needs_hidden(self) -> bool:
        """The engine hands every position's hidden row to observe_hidden (MTP reads them)."""
        return self.proposer.needs_hidden()

    def observe_hidden(self, scheduled, hidden, requests) -> None:
        """The step's hidden rows of each scheduled entry (and its Request) to the proposer. A proposer's error
        costs drafts, never a request: the entries it was reading are forgotten (their drafts start afresh)."""
        for s, h, req in zip(scheduled, hidden, requests):
            if h is None:
                continue
            try:
                self.proposer.observe_hidden(s.req_id, s.start_pos, h, req)
            except Exception:
                logger.exception("speculative decoding: the proposer failed on request %s; it drafts afresh", s.req_id)
                self.forget(s.req_id)

    def propose(self, completions, num_running: int, max_model_len: int) -> None:
        """Drafts for the next step of each (request id, ChildState) that is running; none while the running
        requests alone fill a step's rows (the scheduler would drop them)."""
        for rid, child in completions:
            if child.finish_reason is not None:  # now, not when its whole request ends (n > 1 waits for all)
                self.forget(rid)
        completions = [(rid, child) for rid, child in completions if child.finish_reason is None]
        for rid, child in completions:
            self.proposer.observe(rid, child.request)
        full = num_running >= SPEC_STEP_ROWS  # no drafts: proposers that keep a cache still take the new tokens
        items = []
        for rid, child in completions:
            req = child.request
            # each accepted draft is an output token, and one more comes after them; all within the context
            room = min(req.max_tokens - req.num_output_tokens - 1, max_model_len - req.num_tokens,
                       self._draft_len.get(rid, self.cfg.num_speculative_tokens))
            items.append((rid, req, 0 if full else room))
        try:
            proposals = self.proposer.propose_many(items)
        except Exception:  # drafts only speed things up: without them every request still runs, exactly
            logger.exception("speculative decoding: the proposer failed; no drafts this step")
            for rid, _, _ in items:
                self.forget(rid)
            return
        for (_, req, _), drafts in zip(items, proposals):
            req.spec_token_ids = drafts

    def verify(self, s, hidden_rows: np.ndarray, compute_logits: Callable, child, generator, eos_token_ids,
               mask: Callable) -> Verified:
        """A completion's drafts (scheduled entry s, ChildState child) checked by the rows of its last token and of
        each draft; generator: the one its random rows draw from."""
        k = len(s.spec_token_ids)
        logits = compute_logits(hidden_rows[-(k + 1):], per_row=True)  # each row as a decode step's
        req = child.request
        row = SamplingRow(child.params, None, req.prompt_token_ids, req.output_token_ids)
        v = verify_drafts(logits, s.spec_token_ids, row, eos_token_ids, generator, child.grammar, mask)
        accepted = next((i for i, (t, d) in enumerate(zip(v.tokens, s.spec_token_ids)) if t != d),
                        min(len(v.tokens), k))
        self.stats.record(k, accepted)
        # all taken: one more next time; else as many as were taken and one (rows of rejected drafts cost a step)
        grown = max(k, self._draft_len.get(s.req_id, 0)) + 1  # k may have been cut by the row budget or the match
        self._draft_len[s.req_id] = min(self.cfg.num_speculative_tokens, grown if accepted == k else accepted + 1)
        return v

    def forget(self, rid: str) -> None:
        self._draft_len.pop(rid, None)
        self.proposer.forget(rid)
