"""Slots of the per-sequence states that linear-attention layers keep instead of KV blocks (qwen3.5's Gated DeltaNet).

Ids only (the runner owns the state pools, one pair of arrays per linear-attention layer, indexed by slot; a slot id
is shared by all those layers, like a block id). Slot 0 is scratch (the engine's warm-up), never handed out. A slot is
free, held by a running request (its live state), or a checkpoint: the state at a block boundary of some sequence,
keyed by the hash of the block that ends there (vLLM's hybrid cache: states saved at block boundaries, found through
the block hashes, evicted with them). Checkpoints are evicted least recently used first when a slot is needed, and
dropped when the pool evicts their block (a prefix needs all its blocks anyway). A checkpoint being read this step (a
prefix-cache hit copies it into the request's live slot before the step runs) is pinned until the step is over.
"""
from __future__ import annotations

from collections import OrderedDict, deque


class StatePool:
    def __init__(self, num_slots: int):
        if num_slots < 2:
            raise ValueError(f"the state pool needs at least 2 slots (1 usable + the scratch slot), got {num_slots}")
        self.num_slots = num_slots
        self.free: deque[int] = deque(range(1, num_slots))
        self.checkpoints: OrderedDict[bytes, int] = OrderedDict()  # block hash -> slot, least recently used first
        self.pins: dict[int, int] = {}  # checkpoint slot -> reads pending this step
        self.orphans: set[int] = set()  # pinned slots whose checkpoint was dropped: freed when unpinned

    @property
    def num_usable(self) -> int:
        return self.num_slots - 1

    @property
    def num_available(self) -> int:
        """Slots take() can return: free ones and unpinned checkpoints."""
        return len(self.free) + sum(1 for s in self.checkpoints.values() if s not in self.pins)

    @property
    def num_checkpoints(self) -> int:
        return len(self.checkpoints)

    def take(self) -> int | None:
        """A slot for a live state or a new checkpoint: a free one, else the least recently used unpinned checkpoint's
        (evicted); None when neither exists."""
        if self.free:
            return self.free.popleft()
        for h, slot in self.checkpoints.items():
            if slot not in self.pins:
                del self.checkpoints[h]
                return slot
        return None

    def release(self, slot: int) -> None:
        assert 0 < slot < self.num_slots and slot not in self.free, f"state slot {slot} released twice"
        self.free.append(slot)

    def lookup(self, block_hash: bytes, touch: bool = False) -> int | None:
        """The checkpoint slot saved at the end of the block with this hash, or None; touch: mark it recently used."""
        slot = self.checkpoints.get(block_hash)
        if slot is not None and touch:
            self.checkpoints.move_to_end(block_hash)
        return slot

    def publish(self, block_hash: bytes, slot: int) -> None:
        """A computed state becomes the checkpoint of block_hash (a duplicate of a kept one is freed instead)."""
        if block_hash in self.checkpoints:
            self.release(slot)
        else:
            self.checkpoints[block_hash] = slot

    def drop(self, block_hash: bytes) -> None:
        """The block ending at this checkpoint left the prefix cache: so does the checkpoint."""
        slot = self.checkpoints.pop(block_hash, None)
        if slot is None:
            return
        if slot in self.pins:
            self.orphans.add(slot)
        else:
            self.release(slot)

    def pin(self, slot: int) -> None:
        self.pins[slot] = self.pins.get(slot, 0) + 1

    def unpin(self, slot: int) -> None:
        n = self.pins.pop(slot) - 1
        if n:
            self.pins[slot] = n
        elif slot in self.orphans:
            self.orphans.discard(slot)
            self.release(slot)

    def reset(self) -> None:
        """Drops every checkpoint (pinned ones once their readers are done)."""
        for h in list(self.checkpoints):
            self.drop(h)
