"""The RAM tier's bookkeeping (--num-cpu-blocks): host block ids and which swapped-out request holds them.

Ids only, no arrays (offload/kv_tiers.HostKVTier owns the host copies). Unlike the device pool there is no
null block: host ids 0..num_blocks-1 are all usable. Free ids are reused oldest-freed first.
"""
from __future__ import annotations

from collections import deque


class SwapSpace:
    """num_blocks host blocks; a swapped-out request's host ids are kept in its block-table order."""

    def __init__(self, num_blocks: int):
        if num_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.free_queue: deque[int] = deque(range(num_blocks))
        self.tables: dict[str, list[int]] = {}  # request id -> host ids, position j of its block table at [j]

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of host blocks held by swapped-out requests."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def num_swapped(self) -> int:
        """Requests whose KV is in the RAM tier now."""
        return len(self.tables)

    def free_block_ids(self) -> list[int]:
        """The free list from head (reused first) to tail."""
        return list(self.free_queue)

    def holds(self, request_id: str) -> bool:
        return request_id in self.tables

    def take(self, request_id: str, n: int) -> list[int] | None:
        """n host blocks for a request's table, or None (nothing taken) when fewer are free."""
        if n > len(self.free_queue):
            return None
        assert request_id not in self.tables, f"request {request_id!r} is already swapped out"
        ids = [self.free_queue.popleft() for _ in range(n)]
        self.tables[request_id] = ids
        return ids

    def release(self, request_id: str) -> list[int]:
        """Frees a request's host blocks (none held: []); returns them in block-table order."""
        ids = self.tables.pop(request_id, [])
        self.free_queue.extend(ids)
        return ids
