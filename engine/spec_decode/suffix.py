"""The suffix proposer (vLLM's "suffix" method, Suffix Decoding): a tree per running request over its prompt and
output, and one tree over the outputs of recent requests (shared by all; the oldest leave first past
suffix_decoding_max_cached_requests). A request's draft is the better scoring of the two trees' drafts for its last
tokens, its length set by how long a suffix matched and how frequent its continuation is."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from cpu_kernels import suffix_tree as st
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.proposer import Proposer


class SuffixTree:
    """One tree of sequences (cpu_kernels/suffix_tree.py) with each sequence's open suffixes, kept to extend it."""

    def __init__(self, max_depth: int, capacity: int = 1024):
        self.max_depth = max_depth
        self.nodes, self.keys, self.values, self.meta = st.new_tree(capacity)
        self._open: dict = {}  # sequence -> (its open suffixes' end nodes, how many)

    def extend(self, seq, tokens) -> None:
        if len(tokens) == 0:
            return
        tokens = np.asarray(tokens, np.int32)
        self.nodes, self.keys, self.values = st.make_room(self.nodes, self.keys, self.values, self.meta, len(tokens),
                                                          self.max_depth)
        active, n = self._open.get(seq) or (np.zeros(self.max_depth, np.int32), 0)
        n = st.extend(self.nodes, self.keys, self.values, self.meta, active, n, tokens, self.max_depth)
        self._open[seq] = (active, n)

    def remove(self, seq, tokens) -> None:
        """Takes sequence seq, whose tokens were all put in, back out."""
        self._open.pop(seq, None)
        if len(tokens):
            st.remove(self.nodes, self.keys, self.values, self.meta, np.asarray(tokens, np.int32), self.max_depth)

    def close(self, seq) -> None:
        """No more tokens for seq (it stays in the tree)."""
        self._open.pop(seq, None)

    def speculate(self, context: np.ndarray, max_tokens: int, factor: float, min_prob: float):
        out = np.empty(max(max_tokens, 0), np.int32)
        n, score, _ = st.speculate(self.nodes, self.keys, self.values, context, max_tokens, factor, 0.0, min_prob, out)
        return out[:n].tolist(), score


class SuffixProposer(Proposer):
    def __init__(self, cfg: SpeculativeConfig):
        self.k, self.depth = cfg.num_speculative_tokens, cfg.suffix_decoding_max_tree_depth
        self.factor, self.min_prob = cfg.suffix_decoding_max_spec_factor, cfg.suffix_decoding_min_token_prob
        self.max_cached = cfg.suffix_decoding_max_cached_requests
        self.responses = SuffixTree(self.depth) if self.max_cached else None  # outputs of recent requests
        self._cached: OrderedDict = OrderedDict()  # request id -> its output tokens in `responses`, oldest first
        self._local: dict = {}  # running request id -> (its prompt-and-output tree, tokens of it put in)

    def observe(self, rid, req) -> None:
        """Puts request rid's new tokens (its Request req) in its tree and its output in the shared one."""
        tokens = req.all_token_ids
        local, seen = self._local.get(rid) or (None, 0)
        if local is None:
            local = SuffixTree(self.depth)
            if self.responses is not None:
                if rid in self._cached:  # a finished request's id used again: its old output leaves first
                    self.responses.remove(rid, self._cached.pop(rid))
                self._cached[rid] = []
                self._evict()
        local.extend(0, tokens[seen:])
        if rid in self._cached:  # (an old running request's output may have been evicted already)
            new = tokens[max(seen, req.num_prompt_tokens):]
            self.responses.extend(rid, new)
            self._cached[rid].extend(new)
        self._local[rid] = (local, len(tokens))

    def propose(self, rid, req, limit: int) -> list[int]:
        """Up to min(k, limit) tokens for request rid (observed up to its last token)."""
        k = min(self.k, limit)
        if k <= 0:
            return []
        context = np.asarray(req.all_token_ids[-self.depth:], np.int32)
        draft, score = self._local[rid][0].speculate(context, k, self.factor, self.min_prob)
        if self.responses is not None:
            other, other_score = self.responses.speculate(context, k, self.factor, self.min_prob)
            if other_score > score:
                draft = other
        return draft

    def forget(self, rid) -> None:
        """The request finished: its tree goes; its output stays among the recent ones."""
        self._local.pop(rid, None)
        if self.responses is not None:
            self.responses.close(rid)

    def _evict(self) -> None:
        while len(self._cached) > self.max_cached:
            old, tokens = self._cached.popitem(last=False)
            self.responses.remove(old, tokens)

    def warm_up(self) -> None:
        st.warm_up()
