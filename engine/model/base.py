"""The decoder every architecture shares: embed -> blocks -> final norm -> logits."""
from __future__ import annotations

import math

import numpy as np

from cpu_kernels import activations
from engine.worker.batch import BatchMetadata
from engine.model.config import ModelConfig
from engine.model import layers
from engine.model.layers import Linear, RMSNorm, has


class DecoderModel:
    """Subclasses build `self.blocks` (callables (x, meta, kv) -> x) in `build_blocks`."""

    embed_scale: bool = False  # Gemma multiplies embeddings by sqrt(hidden_size)
    prefill_dtype: str = "auto"  # the dense path's precision for long prefill chunks (EngineArgs.prefill_dtype)

    def __init__(self, config: ModelConfig, weights, batch_invariant: bool = False):
        self.config = config
        self.batch_invariant = batch_invariant
        ws = weights
        self.embed = Linear(ws, "token_embd.weight", None, batch_invariant)
        self.final_norm = RMSNorm(ws, "output_norm.weight", config.rms_norm_eps)
        tied = config.tie_word_embeddings or not has(ws, "output.weight")
        self.lm_head = self.embed if tied else Linear(ws, "output.weight", None, batch_invariant)
        self.blocks = [self.build_block(ws, i) for i in range(config.num_layers)]

    def build_block(self, ws, layer: int):
        raise NotImplementedError

    def embed_tokens(self, input_ids: np.ndarray) -> np.ndarray:
        x = self.embed.weight.embed(np.ascontiguousarray(input_ids, dtype=np.int64))
        if self.embed_scale:
            # HF casts the normalizer to the activation dtype (fp32 here) before multiplying.
            x *= np.float32(math.sqrt(self.config.hidden_size))
        return x

    def forward(self, meta: BatchMetadata, kv_caches: list) -> np.ndarray:
        """Runs all blocks over the flattened batch; returns hidden states (T, H) before the final norm."""
        x = self.embed_tokens(meta.input_ids)
        layers.ROWS = layers.RowGroups(meta.query_start_loc, self.prefill_dtype)
        try:
            for block, kv in zip(self.blocks, kv_caches):
                x = block(x, meta, kv)
        finally:
            layers.ROWS = layers.RowGroups()
        return x

    def compute_logits(self, hidden: np.ndarray, per_row: bool = False) -> np.ndarray:
        """hidden (R, H) -> logits (R, vocab) float32. per_row: the rows come from different sequences
        (one sampled row each), so each runs the M = 1 kernel and its logits do not depend on the batch."""
        h = self.final_norm(np.ascontiguousarray(hidden, dtype=np.float32))
        logits = self.lm_head(h, per_row=per_row)
        if self.config.final_logit_softcap:
            activations.softcap(logits, self.config.final_logit_softcap)
        return logits

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        return (num_blocks, block_size, self.config.num_kv_heads, self.config.head_dim)
