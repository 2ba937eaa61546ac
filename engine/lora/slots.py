"""SlotWeights: one adapted weight's updates in each of the max_loras slots a step's rows pick from, stacked and
zero-padded to max_lora_rank, as cpu_kernels/lora.py reads them."""
from __future__ import annotations

import numpy as np

from cpu_kernels.lora import lora_add, lora_embed_add
from cpu_kernels.quant.threads import serial_if, serial_work


class SlotWeights:
    """a (S, R, K) (the embedding's: (S, V, R), rows by token), b (S, R, N) = B^T * scale, ranks (S,) (0: no update
    in that slot)."""

    def __init__(self, num_slots: int, max_rank: int, k: int, n: int, embedding: bool = False):
        self.embedding = embedding
        self.a = np.zeros((num_slots, k, max_rank) if embedding else (num_slots, max_rank, k), np.float32)
        self.b = np.zeros((num_slots, max_rank, n), np.float32)
        self.ranks = np.zeros(num_slots, np.int32)

    def set(self, slot: int, pair: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Slot `slot` takes an adapter's (A (r, K), B^T (r, N)), or no update (None)."""
        if pair is None:
            self.ranks[slot] = 0
            return
        a, bt = pair
        r = a.shape[0]
        if self.embedding:
            self.a[slot, :, :r] = a.T
        else:
            self.a[slot, :r] = a
        self.b[slot, :r] = bt
        self.ranks[slot] = r

    def _work(self, slots: np.ndarray) -> int:
        """Bytes of A and B the step's adapted rows read (the kernels' thread-count threshold counts bytes)."""
        rows = int(np.count_nonzero(slots >= 0))
        k = 1 if self.embedding else self.a.shape[2]  # an embedding row reads one A value per rank
        return rows * int(self.ranks.max()) * (k + self.b.shape[2]) * 4

    def add(self, x: np.ndarray, y: np.ndarray, slots: np.ndarray, col0: int = 0) -> None:
        """y[:, col0:col0 + N] += each row's update of x (rows whose slot is -1 or has no update: none)."""
        if not self.ranks.any():
            return
        x = np.ascontiguousarray(x, dtype=np.float32)
        with serial_if(self._work(slots) < serial_work()):
            if y.flags.c_contiguous and y.dtype == np.float32:
                lora_add(x, self.a, self.b, self.ranks, slots, y, col0)
            else:
                out = np.ascontiguousarray(y, dtype=np.float32)
                lora_add(x, self.a, self.b, self.ranks, slots, out, col0)
                y[...] = out

    def add_embedding(self, ids: np.ndarray, x: np.ndarray, slots: np.ndarray) -> None:
        """x[t] += the update of token ids[t]'s embedding (x: the embedded rows, float32, C-contiguous)."""
        if self.ranks.any():
            with serial_if(self._work(slots) < serial_work()):
                lora_embed_add(np.ascontiguousarray(ids, dtype=np.int64), self.a, self.b, self.ranks, slots, x)
