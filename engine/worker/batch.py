"""The flattened batch a forward pass consumes: the runner builds it, the model and kernels read it."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


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
    """
    input_ids: np.ndarray
    positions: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    logits_indices: np.ndarray

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
