"""The draft-model proposer (vLLM's "draft_model"): a smaller model with the target's vocabulary, loaded by the same
loader and run by the same kind of ModelRunner with a KV pool of its own, guesses each request's next tokens greedily
(its argmax, a point-mass proposal: verify.py's check is exact for it, greedy or sampled).

Each request keeps draft blocks and the tokens whose KV they hold; a proposal first runs what the draft has not seen
(the prompt the first time; then the tokens accepted since, whose KV differs from the rejected drafts' from the first
differing position on), then one token per draft, all requests of the step batched together."""
from __future__ import annotations

import numpy as np

from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.own_blocks import OwnBlocks
from engine.spec_decode.proposer import Proposer
from engine.worker.runner import SeqChunk


class DraftModelProposer(Proposer):
    def __init__(self, cfg: SpeculativeConfig, target_args, target_config, target_num_blocks: int):
        from engine.args import EngineArgs
        from engine.loading import load_everything
        from engine.worker.runner import ModelRunner
        # the draft's pool holds as many tokens as the target's, in its own (smaller) blocks
        args = EngineArgs(model=cfg.model, max_model_len=target_args.max_model_len, block_size=target_args.block_size,
                          kv_cache_dtype=target_args.kv_cache_dtype, num_threads=target_args.num_threads,
                          quantization=cfg.quantization, num_gpu_blocks_override=target_num_blocks)
        loaded = load_everything(args)
        if loaded.config.vocab_size != target_config.vocab_size:
            raise ValueError(f"speculative_config.model {cfg.model!r}: its vocabulary ({loaded.config.vocab_size} "
                             f"tokens) is not the target model's ({target_config.vocab_size})")
        if loaded.model.num_state_slots:
            raise ValueError(f"speculative_config.model {cfg.model!r} has linear-attention layers: not supported "
                             f"as a draft model")
        self.k = cfg.num_speculative_tokens
        self.runner = ModelRunner(loaded.model, min(loaded.num_blocks), target_args.block_size,
                                  target_args.kv_cache_dtype)  # one block table serves every cache group
        self.block_size = self.runner.block_size
        self.blocks = OwnBlocks(self.runner.num_blocks, self.block_size)
        self._seen: dict = {}  # request id -> the tokens whose KV its draft blocks hold

    def warm_up(self) -> None:
        n = min(8, (self.runner.num_blocks - 1) * self.block_size - 1)
        if n >= 2:
            blocks = tuple(range(1, 1 + (n + self.block_size) // self.block_size))
            hidden = self.runner.execute_hidden([SeqChunk((0,) * n, 0, blocks, "last")])
            self.runner.compute_logits(hidden[0], per_row=True)

    def propose_many(self, items) -> list[list[int]]:
        """items: (request id, Request, limit) -> each request's drafts (up to min(k, limit) tokens), the draft's
        steps batched over the requests."""
        out: list[list[int]] = [[] for _ in items]
        live = []  # (index in items, tokens the draft's KV will hold, drafts wanted)
        chunks = []
        for i, (rid, req, limit) in enumerate(items):
            want = min(self.k, limit)
            tokens = list(req.all_token_ids)
            blocks = self.blocks.reserve(rid, len(tokens) + want - 1) if want > 0 else None
            if blocks is None:
                continue
            start = _common_prefix(self._seen.get(rid, ()), tokens, len(tokens) - 1)  # the last token's row: draft 1
            chunks.append(SeqChunk(tuple(tokens[start:]), start, tuple(blocks), "last"))
            live.append((i, tokens, want))
        for step in range(self.k):
            if not chunks:
                break
            rows = self.runner.compute_logits(np.concatenate(self.runner.execute_hidden(chunks)), per_row=True)
            next_chunks, next_live = [], []
            for (i, tokens, want), c, row in zip(live, chunks, rows):
                t = int(np.argmax(row))
                out[i].append(t)
                self._seen[items[i][0]] = tokens + out[i][:-1]
                if len(out[i]) < want:
                    next_chunks.append(SeqChunk((t,), c.start + len(c.token_ids), c.block_ids, "last"))
                    next_live.append((i, tokens, want))
            chunks, live = next_chunks, next_live
        return out

    def forget(self, rid) -> None:
        self.blocks.release(rid)
        self._seen.pop(rid, None)


def _common_prefix(a, b, limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
