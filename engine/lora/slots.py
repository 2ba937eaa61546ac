"""SlotWeights: one adapted weight's updates in each of the max_loras slots a step's rows pick from, stacked and
zero-padded to max_lora_rank, as cpu_kernels/lora.py reads them."""
from __future__ import annotations

import numpy as np

from cpu_kernels.lora import lora_add, lora_embed_add
from cpu_kernels.quant.threads import serial_if, serial_work


def slot_order(slots: np.ndarray) -> np.ndarray:
    """The rows sorted by adapter slot (stable), as lora_add takes them."""
    return np.argsort(slots, kind="stable")


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounded to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def add_parts(parts: list, x: np.ndarray, y: np.ndarray, slots: np.ndarray, order: np.ndarray | None = None) -> None:
    """Adds the updates of several adapted weights that read the same x, each into its columns of y: parts
    [(SlotWeights, first column)], of one storage type, in one kernel call. order: the rows sorted by slot."""
    parts = [(w, c) for w, c in parts if w.max_rank]
    if not parts:
        return
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float32)
    out = y if y.flags.c_contiguous and y.dtype == np.float32 else np.ascontiguousarray(y, dtype=np.float32)
    if order is None:
        order = slot_order(slots)
    ranks = np.stack([w.ranks for w, _ in parts]) if len(parts) > 1 else parts[0][0].ranks[None]
    cols = np.array([c for _, c in parts], np.int64)
    args = (x, tuple(w.a for w, _ in parts), tuple(w.b for w, _ in parts), ranks, cols, slots, order, out)
    if all(w._serial(slots) for w, _ in parts):
        with serial_if(True):
            lora_add(*args)
    else:
        lora_add(*args)
    if out is not y:
        y[...] = out


class SlotWeights:
    """a (S, R, K) (the embedding's: (S, V, R), rows by token), b (S, R, N) = B^T * scale, ranks (S,) (0: no update
    in that slot); float32, or bfloat16 bits (uint16) for dtype "bfloat16": half the bytes a step reads."""

    def __init__(self, num_slots: int, max_rank: int, k: int, n: int, embedding: bool = False,
                 dtype: str = "float32"):
        self.embedding = embedding
        self.bf16 = dtype == "bfloat16"
        store = np.uint16 if self.bf16 else np.float32
        self.a = np.zeros((num_slots, k, max_rank) if embedding else (num_slots, max_rank, k), store)
        self.b = np.zeros((num_slots, max_rank, n), store)
        self.ranks = np.zeros(num_slots, np.int32)
        self.max_rank = 0  # the largest rank in a slot now (0: nothing to add)

    def set(self, slot: int, pair: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Slot `slot` takes an adapter's (A (r, K), B^T (r, N)), or no update (None)."""
        if pair is None:
            self.ranks[slot] = 0
            self.max_rank = int(self.ranks.max())
            return
        a, bt = pair
        r = a.shape[0]
        if self.bf16:
            a, bt = to_bf16(a), to_bf16(bt)
        if self.embedding:
            self.a[slot, :, :r] = a.T
        else:
            self.a[slot, :r] = a
        self.b[slot, :r] = bt
        self.ranks[slot] = r
        self.max_rank = int(self.ranks.max())

    def _serial(self, slots: np.ndarray) -> bool:
        """Whether the step's update is too little work for the thread pool (bytes of A and B its rows read, the
        measure of the kernels' threshold; every row counted: an upper bound)."""
        k = 1 if self.embedding else self.a.shape[2]  # an embedding row reads one A value per rank
        return len(slots) * self.max_rank * (k + self.b.shape[2]) * self.b.itemsize < serial_work()

    def add(self, x: np.ndarray, y: np.ndarray, slots: np.ndarray, col0: int = 0,
            order: np.ndarray | None = None) -> None:
        """y[:, col0:col0 + N] += each row's update of x (rows whose slot is -1 or has no update: none). order: the
        rows sorted by slot (RowGroups.lora_order), computed here when not given."""
        add_parts([(self, col0)], x, y, slots, order)

    def add_embedding(self, ids: np.ndarray, x: np.ndarray, slots: np.ndarray) -> None:
        """x[t] += the update of token ids[t]'s embedding (x: the embedded rows, float32, C-contiguous)."""
        if self.max_rank:
            with serial_if(self._serial(slots)):
                lora_embed_add(np.ascontiguousarray(ids, dtype=np.int64), self.a, self.b, self.ranks, slots, x)
