"""The decoder every architecture shares: embed (and per-layer embeddings, Gemma 4; learned absolute positions and
token types, BERT) -> blocks (one per layer, from the architecture's BlockSpecs, each over its paged cache or, for a
KV-shared layer, the one it reads) -> final norm (where the architecture has one) -> logits."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from cpu_kernels import activations
from engine.core.kv_spec import layer_groups, layout_state_bytes
from engine.model.block import Block
from engine.model.config import ModelConfig
from engine.model.parts.linear import Linear, has
from engine.model.parts.norm import RMSNorm
from engine.model.parts.per_layer import STEP_KEY, PerLayerEmbeddings
from engine.model.parts.positions import AbsoluteEmbeddings
from engine.worker.batch import BatchMetadata, RowGroups

DEFAULT_STATE_SLOTS = 8


def _identity(x: np.ndarray) -> np.ndarray:
    return x  # no final norm: the last layer's rows are the output


class DecoderModel:
    """blocks: callables (x, meta, kv) -> x, one per layer (the offload layer may replace some by torch twins)."""

    def __init__(self, arch, config: ModelConfig, weights, batch_invariant: bool = False):
        self.arch, self.config, self.batch_invariant = arch, config, batch_invariant
        self.prefill_dtype = "auto"  # the long prefill chunks' precision (EngineArgs.prefill_dtype, from dtype)
        ws = weights
        self.embed = Linear(ws, "token_embd.weight", None, batch_invariant)
        self.final_norm = RMSNorm(ws, "output_norm.weight", config.rms_norm_eps) if arch.final_norm else _identity
        tied = config.tie_word_embeddings or not has(ws, "output.weight")
        self.lm_head = self.embed if tied else Linear(ws, "output.weight", None, batch_invariant)
        shared: dict = {}  # what layers share (RoPE tables)
        self.blocks = [Block(arch.block(config, i), ws, config, i, batch_invariant, shared)
                       for i in range(config.num_layers)]
        # each layer's cache (core/kv_spec: paged LayerKV, or a LayerState for a linear-attention layer)
        self.kv_layout = arch.kv_layout(config)
        # Linear-attention layers keep a state per sequence in a pool of slots (slot 0: scratch for the warm-up and
        # single-sequence callers); the loader sets the engine's count from the cache budget.
        self.num_state_slots = DEFAULT_STATE_SLOTS if layout_state_bytes(self.kv_layout) else 0
        # the cache each layer reads: its own, or the earlier layer's it shares
        self.kv_sources = [kv.shared_from if kv.shared_from >= 0 else i for i, kv in enumerate(self.kv_layout)]
        ple = arch.per_layer_embedding(config)
        self.per_layer = PerLayerEmbeddings(ple, ws, config, batch_invariant) if ple is not None else None
        absolute = arch.absolute_embedding(config)
        self.absolute = AbsoluteEmbeddings(absolute, ws, config) if absolute is not None else None
        self.layer_groups = layer_groups(self.kv_layout)  # each layer's cache group (its block tables)
        self.lora_embed = self.lora_head = None  # lora/slots.SlotWeights once an adapter adapts them

    def embed_tokens(self, input_ids: np.ndarray, lora_slots: np.ndarray | None = None) -> np.ndarray:
        x = self.embed.weight.embed(np.ascontiguousarray(input_ids, dtype=np.int64))
        if self.lora_embed is not None and lora_slots is not None:  # scaled with the embedding, as PEFT does
            self.lora_embed.add_embedding(input_ids, x, lora_slots)
        if self.arch.embed_scale:
            # HF casts the normalizer to the activation dtype (fp32 here) before multiplying.
            x *= np.float32(math.sqrt(self.config.hidden_size))
        return x

    def forward(self, meta: BatchMetadata, kv_caches: list) -> np.ndarray:
        """Runs all blocks over the flattened batch; returns hidden states (T, H) before the final norm."""
        x = self.embed_tokens(meta.input_ids, meta.lora_slots)
        if self.absolute is not None:
            x = self.absolute(x, meta.positions, meta.token_types)
        meta = dataclasses.replace(meta, rows=RowGroups(meta.query_start_loc, self.prefill_dtype, meta.lora_slots))
        if self.per_layer is not None:  # every layer's share, once per token
            meta.step_cache[STEP_KEY] = self.per_layer(meta.input_ids, x, meta.rows)
        views = meta.group_views()  # a batch with one table (no group_tables) serves every group
        for block, src, g in zip(self.blocks, self.kv_sources, self.layer_groups):
            x = block(x, views[g] if g < len(views) else meta, kv_caches[src])
        return x

    def compute_logits(self, hidden: np.ndarray, per_row: bool = False,
                       lora_slots: np.ndarray | None = None) -> np.ndarray:
        """hidden (R, H) -> logits (R, vocab) float32. per_row: the rows come from different sequences
        (one sampled row each), so each runs the M = 1 kernel and its logits do not depend on the batch.
        lora_slots: (R,) int32 each row's adapter slot (-1: none), for an adapter of the output matrix."""
        h = self.final_norm(np.ascontiguousarray(hidden, dtype=np.float32))
        logits = self.lm_head(h, per_row=per_row)
        if self.lora_head is not None and lora_slots is not None:
            self.lora_head.add(h, logits, lora_slots)
        if self.config.final_logit_softcap:
            activations.softcap(logits, self.config.final_logit_softcap)
        return logits
