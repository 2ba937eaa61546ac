"""The block pool of one cache group: block ids with ref counts, the prefix-cache hash map and the free list (LRU
eviction). kv_cache.py's module doc describes the scheme; KVCacheManager holds one pool per cache group."""
from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from dataclasses import dataclass

NULL_BLOCK_ID = 0
ROOT_HASH = hashlib.sha256(b"ramlm-prefix-cache-v1").digest()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hash_block_tokens(parent_hash: bytes | None, token_ids: tuple[int, ...] | list[int],
                      extra_keys: tuple = ()) -> bytes:
    """Chain hash of one full block; stable across processes (tests assert exact reuse)."""
    payload = pickle.dumps((parent_hash or ROOT_HASH, tuple(token_ids), tuple(extra_keys)), protocol=4)
    return hashlib.sha256(payload).digest()


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None  # set while the block is in the hash map


class BlockPool:
    """num_blocks blocks of block_size token slots; block 0 reserved as the null block."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks (1 usable + the null block), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.blocks[NULL_BLOCK_ID].ref_cnt = 1  # permanently held
        # block_id -> block, head = next to reuse (least recently freed cached block).
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks[1:])
        self.cached: dict[bytes, KVCacheBlock] = {}
        self.on_evict = None  # called with the hash of each cached block the pool reuses (hybrid_cache.py)

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref 0, cached or not (a cached one is evicted when needed)."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by some request."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def free_block_ids(self) -> list[int]:
        """The free list from head (reused first) to tail."""
        return list(self.free_queue)

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Takes a reference on prefix-hit blocks; a free one leaves the free list."""
        for b in blocks:
            if b.ref_cnt == 0:
                del self.free_queue[b.block_id]
            b.ref_cnt += 1

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Pops n blocks from the head of the free list, evicting their cached content."""
        if n > self.num_free_blocks:
            raise RuntimeError(f"asked for {n} blocks, {self.num_free_blocks} free")
        out = []
        for _ in range(n):
            _, b = self.free_queue.popitem(last=False)
            if b.block_hash is not None:
                if self.cached.get(b.block_hash) is b:
                    del self.cached[b.block_hash]
                    if self.on_evict is not None:
                        self.on_evict(b.block_hash)
                b.block_hash = None
            b.ref_cnt = 1
            out.append(b)
        return out

    def free_blocks(self, blocks: list[KVCacheBlock]) -> None:
        """Drops one reference from each block, in the given order; see the module doc for placement."""
        for b in blocks:
            b.ref_cnt -= 1
            assert b.ref_cnt >= 0, f"block {b.block_id} freed twice"
            if b.ref_cnt == 0:
                self.free_queue[b.block_id] = b
                if b.block_hash is None:
                    self.free_queue.move_to_end(b.block_id, last=False)

    def cache_block(self, block: KVCacheBlock, block_hash: bytes) -> None:
        """Publishes a computed full block; a duplicate of an already cached hash stays private."""
        if not self.enable_caching or block.block_hash is not None or block_hash in self.cached:
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def reset_prefix_cache(self) -> None:
        """Forgets every hash (blocks in use stay allocated, they just cannot be hit any more)."""
        for b in self.cached.values():
            b.block_hash = None
        self.cached.clear()
