"""ModelRunner: scheduled chunks -> BatchMetadata -> forward -> logits for the rows that need them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.core.kv_spec import (LayerKV, LayerState, cache_groups, is_paged, kv_storage_dtype, layer_groups,
                                  layout_bytes_per_block, storage_array_dtype)
from engine.worker.batch import BatchMetadata
from engine.worker.huge_pages import small_pages, zeros_small_pages


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's share of a step: `token_ids` start at position `start`; its blocks in order.

    logits: 'none' (a prompt chunk that does not reach the end), 'last' (the row that samples), or
    'all' (every row, for prompt logprobs; the last row still samples).
    """
    token_ids: tuple[int, ...]
    start: int
    block_ids: tuple[int, ...]
    logits: str = "last"
    state_slot: int = 0            # linear-attention layers: the sequence's state slot
    snapshot: tuple[int, int] = ()  # (rows, slot): copy the states after that many of token_ids into slot
    group_block_ids: tuple[tuple[int, ...], ...] = ()  # cache groups 1..'s tables; () = block_ids serves them all
    lora_slot: int = -1            # the slot of the sequence's LoRA adapter (engine/lora), -1: none
    token_types: tuple[int, ...] = ()  # each token's type (BERT's segment ids); () = all type 0


def layer_cache(layer: LayerKV, num_blocks: int, block_size: int, kv_cache_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """One layer's (K, V) arrays, zeroed; the same array twice where V is K. Touched block by block while serving,
    so in small pages (huge_pages.py)."""
    shape = layer.block_shape(num_blocks, block_size, kv_cache_dtype)
    dtype = np.dtype(storage_array_dtype(kv_storage_dtype(kv_cache_dtype)))
    k = zeros_small_pages(shape, dtype)
    return k, (k if layer.v_is_k else zeros_small_pages(shape, dtype))


def state_pools(layer: LayerState, num_slots: int) -> tuple[np.ndarray, ...]:
    """A linear-attention layer's float32 state pools (num_slots, *one sequence's array) each, zeroed."""
    return tuple(zeros_small_pages(shape, np.float32) for shape in layer.pool_shapes(num_slots))


class ModelRunner:
    """Owns the model and its caches, as the model's kv_layout declares them layer by layer: a (K, V) pair of paged
    blocks per attention layer (V is K, one array, where the layer reads its values from its keys: MLA; a KV-shared
    layer holds its source layer's pair, no memory of its own: Gemma 4) with its cache group's block count (num_blocks:
    one count for every group, or one per group in kv_spec.cache_groups order), a (conv, recurrent) pair of state pools
    (num_state_slots slots) per linear-attention layer."""

    def __init__(self, model, num_blocks: int | Sequence[int], block_size: int = 16, kv_cache_dtype: str = "auto",
                 num_state_slots: int | None = None):
        self.model = model
        self.block_size = block_size
        self.groups = cache_groups(model.kv_layout)
        counts = (num_blocks,) * len(self.groups) if isinstance(num_blocks, int) else tuple(num_blocks)
        if len(counts) != len(self.groups):
            raise ValueError(f"{len(counts)} block counts for {len(self.groups)} cache groups")
        self.group_num_blocks = counts
        self.num_blocks = counts[0]
        self.num_state_slots = model.num_state_slots if num_state_slots is None else num_state_slots
        self.kv_caches = []
        for layer, g in zip(model.kv_layout, layer_groups(model.kv_layout)):
            if layer.shared_from >= 0 and model.kv_layout[layer.shared_from].window != layer.window:
                raise ValueError("a KV-shared layer must slide as its source layer does (one cache group)")
            # a KV-shared layer holds its source layer's pair (the same tuple)
            self.kv_caches.append(self.kv_caches[layer.shared_from] if layer.shared_from >= 0 else
                                  layer_cache(layer, counts[g], block_size, kv_cache_dtype) if is_paged(layer)
                                  else state_pools(layer, self.num_state_slots))
        self.state_layers = [i for i, layer in enumerate(model.kv_layout) if not is_paged(layer)]

    @property
    def windows(self) -> tuple[int, ...]:
        """Each cache group's sliding window (0 = full attention), for the KV-cache manager."""
        return tuple(g.window for g in self.groups)

    @staticmethod
    def kv_bytes_per_block(config, block_size: int, kv_cache_dtype: str = "auto") -> int:
        """One block id's cache in every paged layer (state layers hold none)."""
        from engine.model.registry import architecture
        return layout_bytes_per_block(architecture(config.arch).kv_layout(config), block_size, kv_cache_dtype)

    def copy_states(self, pairs) -> None:
        """pool[dst] = pool[src] in every linear-attention layer, pair by pair in order (a prefix-cache hit restores
        the checkpoint at its block boundary into the request's own slot before the step runs)."""
        for src, dst in pairs:
            for i in self.state_layers:
                for pool in self.kv_caches[i]:
                    pool[dst] = pool[src]

    @staticmethod
    def _tables(chunks: list[SeqChunk], g: int) -> list[tuple[int, ...]]:
        return [c.block_ids if g == 0 or not c.group_block_ids else c.group_block_ids[g - 1] for c in chunks]

    def _group_table(self, chunks: list[SeqChunk], g: int, pos: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Cache group g's block tables (S, max_blocks) and slot mapping (T,) of the batch."""
        bs = self.block_size
        group = self._tables(chunks, g)
        tables = np.zeros((len(chunks), max(len(t) for t in group)), dtype=np.int32)
        slots = []
        for s, (c, ids, p) in enumerate(zip(chunks, group, pos)):
            if c.start + len(c.token_ids) > len(ids) * bs:
                raise ValueError(f"sequence {s}: {c.start + len(c.token_ids)} tokens need more than its {len(ids)} "
                                 f"blocks")
            blocks = np.asarray(ids, dtype=np.int64)
            slots.append(blocks[p // bs] * bs + p % bs)
            tables[s, : len(ids)] = ids
        return tables, np.concatenate(slots)

    def build_batch(self, chunks: list[SeqChunk]) -> BatchMetadata:
        ids, pos, qsl, lens, logit_rows = [], [], [0], [], []
        state_slots = np.asarray([c.state_slot for c in chunks], np.int32)
        snap_rows = np.asarray([c.snapshot[0] if c.snapshot else 0 for c in chunks], np.int32)
        snap_slots = np.asarray([c.snapshot[1] if c.snapshot else 0 for c in chunks], np.int32)
        if self.state_layers:
            self._check_states(state_slots, snap_rows, snap_slots)
        for c in chunks:
            n = len(c.token_ids)
            end = c.start + n
            ids.append(np.asarray(c.token_ids, dtype=np.int64))
            pos.append(np.arange(c.start, end, dtype=np.int64))
            row0 = qsl[-1]
            if c.logits == "all":
                logit_rows.extend(range(row0, row0 + n))
            elif c.logits == "last":
                logit_rows.append(row0 + n - 1)
            qsl.append(row0 + n)
            lens.append(end)
        tables, slots = self._group_table(chunks, 0, pos)
        lora_slots = None
        if any(c.lora_slot >= 0 for c in chunks):
            lora_slots = np.concatenate([np.full(len(c.token_ids), c.lora_slot, np.int32) for c in chunks])
        token_types = None
        if any(c.token_types for c in chunks):
            token_types = np.concatenate([np.asarray(c.token_types or (0,) * len(c.token_ids), np.int64)
                                          for c in chunks])
        return BatchMetadata(
            input_ids=np.concatenate(ids), positions=np.concatenate(pos),
            query_start_loc=np.asarray(qsl, dtype=np.int32), seq_lens=np.asarray(lens, dtype=np.int32),
            block_tables=tables, slot_mapping=slots, logits_indices=np.asarray(logit_rows, dtype=np.int64),
            state_slots=state_slots, snap_rows=snap_rows, snap_slots=snap_slots,
            group_tables=tuple(self._group_table(chunks, g, pos) for g in range(1, len(self.groups))),
            lora_slots=lora_slots, token_types=token_types)

    def _check_states(self, state_slots, snap_rows, snap_slots) -> None:
        """Each sequence its own slot, snapshots into other slots: the kernels write them from parallel units."""
        n = self.num_state_slots
        used = list(state_slots) + [s for r, s in zip(snap_rows, snap_slots) if r > 0]
        if len(set(used)) != len(used) or any(not 0 <= s < n for s in used):
            raise ValueError(f"state slots {state_slots.tolist()} (snapshots {snap_slots.tolist()}) must be distinct "
                             f"and below {n}")

    def execute_hidden(self, chunks: list[SeqChunk]) -> list[np.ndarray | None]:
        """Runs one forward pass; returns per chunk the hidden rows its `logits` asks for, or None.
        The engine turns them into logits in slices (a 512-row prompt x 262k vocab is 512 MB)."""
        meta = self.build_batch(chunks)
        with small_pages():  # a step's arrays: huge_pages.py
            hidden = self.model.forward(meta, self.kv_caches)
        rows = hidden[meta.logits_indices]
        out, r = [], 0
        for c in chunks:
            k = {"none": 0, "last": 1, "all": len(c.token_ids)}[c.logits]
            out.append(rows[r:r + k] if k else None)
            r += k
        return out

    def compute_logits(self, hidden_rows: np.ndarray, per_row: bool = False,
                       lora_slots: np.ndarray | None = None) -> np.ndarray:
        """lora_slots: (R,) int32 each row's adapter slot (-1: none), or None."""
        with small_pages():
            return self.model.compute_logits(hidden_rows, per_row=per_row, lora_slots=lora_slots)

    def execute(self, chunks: list[SeqChunk]) -> list[np.ndarray | None]:
        """Runs one forward pass; returns per chunk its logits rows (1 or n rows) or None."""
        return [None if h is None else self.compute_logits(h) for h in self.execute_hidden(chunks)]
