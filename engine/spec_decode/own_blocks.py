"""Paged blocks a proposer keeps for its own cache (a draft model's, an MTP layer's): each request's block table
from a free list, grown as its tokens grow, given back when it ends. Block 0 is the null block."""
from __future__ import annotations


class OwnBlocks:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, 0, -1))
        self._tables: dict = {}  # request id -> its blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def reserve(self, rid, num_tokens: int):
        """Request rid's blocks, grown to hold num_tokens positions; None (nothing taken) when the pool lacks them."""
        table = self._tables.get(rid, [])
        need = -(-num_tokens // self.block_size) - len(table)
        if need > len(self._free):
            return None
        table = table + [self._free.pop() for _ in range(max(need, 0))]
        self._tables[rid] = table
        return table

    def release(self, rid) -> None:
        self._free.extend(self._tables.pop(rid, ()))
