"""The flattened batch a forward pass consumes: the runner builds it, the model and kernels read it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from cpu_kernels.bf16x32 import HAS_BF16_DOT
from cpu_kernels.quant.linear import GEMV_MAX_M


@dataclass(frozen=True)
class BatchMetadata:
    """One step's tokens from S sequences, flattened to T rows.

    input_ids        (T,) int64   token ids, sequence after sequence
    positions        (T,) int64   absolute position of each token in its sequence
    query_start_loc  (S+1,) int32 rows [query_start_loc[s], query_start_loc[s+1]) belong to sequence s
    seq_lens         (S,) int32   context length of sequence s after this step (cached + new tokens)
    block_tables     (S, max_blocks) int32  KV block ids of each sequence, in order; unused = 0
    slot_mapping     (T,) int64   flat KV slot (block_id * block_size + offset) each new token writes
    logits_indices   (R,) int64   rows whose logits are computed (last row of a sampling sequence,
                                  and every row of a sequence that asked for prompt logprobs)
    group_tables     ((block_tables, slot_mapping), ...) of cache groups 1.. (sliding-window layers), or ()
    state_slots      (S,) int32   linear-attention layers: the state slot of each sequence (a sequence whose
                                  first row is at position 0 starts from zero states)
    snap_rows        (S,) int32   copy the states after this many of the sequence's rows (0: none) ...
    snap_slots       (S,) int32   ... into this slot (a prefix-cache checkpoint at a block boundary)
    rows             RowGroups    which kernels the Linears run on which rows (set by DecoderModel.forward)
    lora_slots       (T,) int32   each row's LoRA adapter slot (-1: the base model), or None: no adapted row
    token_types      (T,) int64   each row's token type (BERT's segment ids), or None: every row type 0
    """
    input_ids: np.ndarray
    positions: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    logits_indices: np.ndarray
    state_slots: np.ndarray | None = None  # None: zeros (slot 0 for every sequence), no snapshots
    snap_rows: np.ndarray | None = None
    snap_slots: np.ndarray | None = None
    rows: "RowGroups | None" = None
    group_tables: tuple = ()
    lora_slots: np.ndarray | None = None
    token_types: np.ndarray | None = None

    def group_views(self) -> list["BatchMetadata"]:
        """One view per cache group (core/kv_spec.cache_groups): group 0 is this batch; group g reads its own block
        tables and slot mapping from group_tables[g - 1] and shares everything else (rows, step_cache)."""
        views = [self]
        for tables, slots in self.group_tables:
            view = dataclasses.replace(self, block_tables=tables, slot_mapping=slots, group_tables=())
            view.__dict__["step_cache"] = self.step_cache  # one RoPE table per step for all groups
            views.append(view)
        return views

    def __post_init__(self):
        S = len(self.seq_lens)
        for name in ("state_slots", "snap_rows", "snap_slots"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros(S, np.int32))

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @cached_property
    def max_seq_len(self) -> int:
        """The longest context (every attention layer sizes its work by it: computed once per step)."""
        return int(self.seq_lens.max()) if self.seq_lens.size else 0

    @cached_property
    def step_cache(self) -> dict:
        """Values every layer of this step shares (the RoPE cos/sin tables), computed by the first to ask."""
        return {}


class RowGroups:
    """A batch's rows grouped by sequence, so that a row's result does not depend on its batch: rows of short
    groups (decodes, small chunks) all run the per-row GEMV kernel, and each long prefill chunk takes the dense
    path on its own rows only. DecoderModel.forward puts it in BatchMetadata.rows for the layers' Linears."""

    def __init__(self, query_start_loc: np.ndarray | None = None, dense_dtype: str = "auto",
                 lora_slots: np.ndarray | None = None):
        self.dense_dtype = dense_dtype  # precision of the long chunks' dense path (QuantLinear.DENSE_DTYPES)
        self.lora_slots = lora_slots  # (T,) int32 adapter slot per row (-1: none), or None (engine/lora)
        # the rows sorted by slot, as the LoRA kernel takes them (each thread's rows: whole adapters)
        self.lora_order = None if lora_slots is None else np.argsort(lora_slots, kind="stable")
        self.num_rows = -1
        self.small = None
        self.large: list[tuple[int, int]] = []
        self.long_seqs = np.zeros(0, np.uint8)  # per sequence: 1 where its chunk is long
        if query_start_loc is None:
            return
        q = np.asarray(query_start_loc, dtype=np.int64)
        lens = np.diff(q)
        self.long_seqs = (lens > GEMV_MAX_M).astype(np.uint8)
        self.num_rows = int(q[-1])
        small = [np.arange(a, b) for a, b, n in zip(q[:-1], q[1:], lens) if 0 < n <= GEMV_MAX_M]
        self.small = np.concatenate(small) if small else np.empty(0, np.int64)
        self.large = [(int(a), int(b)) for a, b, n in zip(q[:-1], q[1:], lens) if n > GEMV_MAX_M]

    def applies_to(self, x: np.ndarray) -> bool:
        return x.shape[0] == self.num_rows

    def bf16_attention(self, x: np.ndarray) -> np.ndarray | None:
        """The long chunks' flags for paged_attention's bf16_seqs where their matmuls may run in bf16 (dense_dtype
        auto or bfloat16) and the CPU has AVX512-BF16 dot products; None where no sequence qualifies."""
        if (not self.large or self.dense_dtype == "float32" or not HAS_BF16_DOT or not self.applies_to(x)):
            return None
        return self.long_seqs
