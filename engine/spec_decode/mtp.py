"""MTP drafts (vLLM's "mtp"): the multi-token-prediction layer Qwen3.5/3.6, DeepSeek-V3 and GLM-4.5 checkpoints
carry after their main layers (GGUF blk.{L}.nextn.* and layer L's block; HF mtp.* / model.layers.{L}.*, mapped at
load) guesses the token after next from the main model's hidden state at a position and the token that follows it:

    out_i = shared_head_norm(block(eh_proj([enorm(embed(x_{i+1})), hnorm(h_i)])))  at position i,
    logits = lm_head(out_i)

with h_i the main model's final-normed hidden state, as vLLM feeds it. Its attention has a paged cache of its own (one
layer, blocks of its own). Each step the layer first runs the positions whose next token became known (the prompt,
then the accepted tokens); its last row gives the first draft; further drafts chain the layer on its own output (the
next h: normed for Qwen3.5, before the shared head's norm for DeepSeek and GLM) and the draft before, as vLLM does
with one MTP layer and k > 1."""
from __future__ import annotations

import dataclasses

import numpy as np

from cpu_kernels import activations
from engine.model.block import Block
from engine.model.parts.linear import Linear, has
from engine.model.parts.norm import RMSNorm
from engine.spec_decode.own_blocks import OwnBlocks
from engine.spec_decode.proposer import Proposer
from engine.worker.batch import RowGroups
from engine.worker.huge_pages import small_pages

CATCH_UP_ROWS = 256  # a request's rows kept before the layer runs them (a long prompt's chunks, before it samples)


class MtpLayer:
    """The model's first MTP layer as a one-layer model: forward(meta, caches, h) -> out rows; logits(out)."""

    def __init__(self, model, batch_invariant: bool = False):
        cfg, ws = model.config, model.weights
        if not cfg.nextn_layers:
            raise ValueError("speculative_config.method 'mtp': this model has no MTP layer (nextn_predict_layers 0)")
        L = cfg.num_layers
        p = f"blk.{L}.nextn."
        spec = model.arch.block(cfg, L)
        self.model, self.config, self.prefill_dtype = model, cfg, "auto"
        self.block = Block(spec, ws, cfg, L, batch_invariant, {})
        self.enorm = RMSNorm(ws, p + "enorm.weight", cfg.rms_norm_eps)
        self.hnorm = RMSNorm(ws, p + "hnorm.weight", cfg.rms_norm_eps)
        self.head_norm = RMSNorm(ws, p + "shared_head_norm.weight", cfg.rms_norm_eps)
        self.eh_proj = Linear(ws, p + "eh_proj.weight", None, batch_invariant)
        # DeepSeek's layer may carry its own embedding and head; where it does not, the model's serve
        self.embed = Linear(ws, p + "embed_tokens.weight", None, batch_invariant) \
            if has(ws, p + "embed_tokens.weight") else model.embed
        self.lm_head = Linear(ws, p + "shared_head_head.weight", None, batch_invariant) \
            if has(ws, p + "shared_head_head.weight") else model.lm_head
        self.kv_layout = (spec.kv(cfg),)
        self.num_state_slots = 0
        # what the next chained step reads as h: Qwen3.5's layer hands on its normed output, DeepSeek's and GLM's the
        # stream before the shared head's norm (vLLM's Qwen3-Next and DeepSeek MTP modules)
        self.chain_normed = cfg.arch.startswith("qwen35")

    def forward(self, meta, kv_caches, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """h f32 (T, H): the main model's final-normed hidden state at each row's position -> (out rows (T, H),
        the rows a chained step reads as its h)."""
        ids = np.ascontiguousarray(meta.input_ids, dtype=np.int64)
        e = self.model.embed_tokens(ids) if self.embed is self.model.embed else self.embed.weight.embed(ids)
        x = self.eh_proj(np.ascontiguousarray(np.concatenate([self.enorm(e), self.hnorm(h)], axis=1)))
        meta = dataclasses.replace(meta, rows=RowGroups(meta.query_start_loc, self.prefill_dtype))
        x = self.block(x, meta, kv_caches[0])
        out = self.head_norm(x)
        return out, (out if self.chain_normed else x)

    def logits(self, out: np.ndarray) -> np.ndarray:
        logits = self.lm_head(np.ascontiguousarray(out, dtype=np.float32), per_row=True)
        if self.config.final_logit_softcap:
            activations.softcap(logits, self.config.final_logit_softcap)
        return logits


class MtpProposer(Proposer):
    def __init__(self, cfg, model, num_blocks: int, block_size: int, kv_cache_dtype: str):
        from engine.worker.runner import ModelRunner
        self.k = cfg.num_speculative_tokens
        self.layer = MtpLayer(model)
        self.runner = ModelRunner(self.layer, num_blocks, block_size, kv_cache_dtype)  # its cache and batches
        self.blocks = OwnBlocks(num_blocks, block_size)
        self._rows: dict = {}  # request id -> {position: the main model's final-normed hidden row}
        self._done: dict = {}  # request id -> positions the layer has run with their true next token

    def needs_hidden(self) -> bool:
        return True

    def observe_hidden(self, rid, start: int, rows: np.ndarray, req) -> None:
        """The main model's rows (pre-norm) for positions start.. of request rid (Request req), this step; a long
        prompt's chunks run through the layer as they come, not all at its end."""
        done = self._done.get(rid, 0)
        normed = self.layer.model.final_norm(np.ascontiguousarray(rows, dtype=np.float32))
        kept = self._rows.setdefault(rid, {})
        for j in range(max(0, done - start), len(normed)):
            kept[start + j] = normed[j]
        if len(kept) >= CATCH_UP_ROWS:
            self.propose_many([(rid, req, 0)])

    def propose_many(self, items) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in items]
        chunks, hs, live = [], [], []
        for i, (rid, req, limit) in enumerate(items):  # limit 0: the layer still runs the new positions
            want = max(min(self.k, limit), 0)
            tokens = req.all_token_ids
            rows = self._rows.get(rid, {})
            todo = [p for p in range(self._done.get(rid, 0), len(tokens) - 1) if p in rows]  # (none before a hit)
            while todo and todo[-1] - todo[0] != len(todo) - 1:  # one run of positions: the trailing one
                todo = todo[1:]
            blocks = self.blocks.reserve(rid, len(tokens) + max(want, 1) - 1) if todo else None
            if blocks is None:  # (no blocks left in the layer's pool: its rows go, it drafts again later)
                for p in todo:
                    rows.pop(p)
                continue
            chunks.append(_chunk(tuple(tokens[p + 1] for p in todo), todo[0], blocks))
            hs.append(np.stack([rows.pop(p) for p in todo]))
            self._done[rid] = len(tokens) - 1
            live.append((i, want if todo[-1] == len(tokens) - 2 else 0))  # drafts need the last position's row
        for _ in range(self.k):
            if not chunks:
                break
            last, chain = self._run(chunks, hs)
            wanted = [j for j, (_, want) in enumerate(live) if want]
            drafts = dict(zip(wanted, np.argmax(self.layer.logits(last[wanted]), axis=1))) if wanted else {}
            next_chunks, next_hs, next_live = [], [], []
            for j, ((i, want), c, row) in enumerate(zip(live, chunks, chain)):
                if not want:
                    continue
                d = drafts[j]
                out[i].append(int(d))
                if len(out[i]) < want:  # the next position: the draft as its token, this output as its h
                    next_chunks.append(_chunk((int(d),), c.start + len(c.token_ids), c.block_ids))
                    next_hs.append(row[None])
                    next_live.append((i, want))
            chunks, hs, live = next_chunks, next_hs, next_live
        return out

    def _run(self, chunks, hs) -> tuple[np.ndarray, np.ndarray]:
        """One forward over the chunks; each chunk's last out row and the row a chained step reads."""
        meta = self.runner.build_batch(chunks)
        with small_pages():
            out, chain = self.layer.forward(meta, self.runner.kv_caches, np.concatenate(hs))
        last = meta.query_start_loc[1:] - 1
        return out[last], chain[last]

    def forget(self, rid) -> None:
        self.blocks.release(rid)
        self._rows.pop(rid, None)
        self._done.pop(rid, None)


def _chunk(tokens, start, blocks):
    from engine.worker.runner import SeqChunk
    return SeqChunk(tuple(tokens), start, tuple(blocks), "all")
