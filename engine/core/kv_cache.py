"""Paged KV-cache bookkeeping: a block pool with ref counts, prefix caching and LRU eviction.

Only block ids and counts live here (no arrays); the runner owns the cache tensors, shaped
(num_blocks, block_size, num_kv_heads, head_dim) per layer, and indexes them with these ids.

Block 0 is the null block: never handed out, so a block table padded with 0 and a slot mapping that
points padding rows at slot 0..block_size-1 never touch a live sequence (BatchMetadata: unused = 0).
A pool of num_blocks therefore has num_blocks - 1 usable blocks.

Prefix caching (vLLM v1's scheme): every full block of a request's tokens has a chain hash
    h_i = sha256(pickle((h_{i-1}, tuple(block tokens), extra_keys)))
with h_{-1} a fixed root and extra_keys = (cache_salt,) on the first block when the request has one.
A block enters the hash map once its KV is computed (the scheduler calls cache_blocks after each
step), so a lookup never returns a block that is still being written. A freed block keeps its hash
(ref 0, still findable) until the pool needs it for something else.

Free list order (the head is reused first):
  - blocks without a hash go to the head: they hold nothing worth keeping;
  - hashed blocks go to the tail, a request's blocks in reverse order (last block first), so eviction
    takes a sequence's tail before its prefix; a prefix hit needs every block before it anyway.
Touching a free cached block (a prefix hit) removes it from the list; allocation pops the head and
drops the popped block's hash, which is the LRU eviction.

Swapping (a RAM tier of num_cpu_blocks host blocks, engine/core/kv_swap.py): swap_out copies *every* block of
the request's table to host blocks and then drops its references exactly as free() does. A block shared
with another request (ref > 1) is copied too, although dropping our reference frees nothing: a swapped
request then holds no device block at all, so device blocks are held only by running requests and the
scheduler's no-livelock argument still holds. Shared blocks are full and computed, so the copy is stable.
Hashed blocks stay in the hash map after the swap-out (free, findable) until evicted. swap_in gives the
request fresh private blocks, one per host block, in block-table order; their hashes are published again
by cache_blocks (a hash still cached elsewhere keeps that block, and the copy stays private).
"""
from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from dataclasses import dataclass

from engine.core.kv_swap import SwapSpace
from engine.core.request import Request

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


class KVCacheManager:
    """Allocates blocks to requests (stored on request.block_ids) with prefix caching."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True,
                 num_cpu_blocks: int = 0):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching)
        self.swap_space = SwapSpace(num_cpu_blocks)  # empty (0 blocks): preemption recomputes
        self._num_cached_blocks: dict[str, int] = {}  # request id -> leading blocks already in the hash map
        self._pending_stats: dict[str, tuple[int, int]] = {}
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    # ---- sizes and stats ----
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # ---- hashing ----
    def block_hashes(self, request: Request) -> list[bytes]:
        """Chain hashes of the request's full blocks (all tokens, outputs included), extended lazily."""
        hashes = request.block_hashes
        tokens = request.all_token_ids
        bs = self.block_size
        for i in range(len(hashes), len(tokens) // bs):
            parent = hashes[i - 1] if i else None
            extra = (request.cache_salt,) if (i == 0 and request.cache_salt is not None) else ()
            hashes.append(hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs], extra))
        return hashes

    # ---- allocation ----
    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix of a request that holds no blocks yet.

        Returns (block ids, num computed tokens), a whole number of blocks and never the whole
        prompt: at least the last token is recomputed so that it yields logits. Takes no reference;
        pass the result straight to allocate_slots.
        """
        if (not self.enable_prefix_caching
                or getattr(request.sampling_params, "prompt_logprobs", None) is not None):
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hit: list[int] = []
        for h in self.block_hashes(request)[:max_hit_blocks]:
            b = self.pool.get_cached_block(h)
            if b is None:
                break
            hit.append(b.block_id)
        num_hit_tokens = len(hit) * self.block_size
        self._pending_stats[request.request_id] = (request.num_tokens, num_hit_tokens)
        return hit, num_hit_tokens

    def can_allocate(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                     new_computed_block_ids: list[int] = ()) -> bool:
        return self._num_blocks_short(request, num_new_tokens, num_new_computed_tokens,
                                      new_computed_block_ids) <= 0

    def _num_blocks_short(self, request, num_new_tokens, num_new_computed_tokens, new_computed_block_ids) -> int:
        total = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_new_blocks = self.blocks_needed(total) - len(request.block_ids) - len(new_computed_block_ids)
        # A hit on a free cached block takes it off the free list too.
        num_revived = sum(1 for i in new_computed_block_ids if self.pool.blocks[i].ref_cnt == 0)
        return max(num_new_blocks, 0) + num_revived - self.pool.num_free_blocks

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_block_ids: list[int] = ()) -> list[int] | None:
        """Gives the request blocks for num_new_tokens more tokens after its computed ones.

        Args:
            num_new_computed_tokens, new_computed_block_ids: a prefix hit from get_computed_blocks
                (first allocation only).
        Returns:
            the newly allocated block ids (maybe empty), appended to request.block_ids after the
            hit blocks; None when the pool is short (nothing changes then).
        """
        if self._num_blocks_short(request, num_new_tokens, num_new_computed_tokens, new_computed_block_ids) > 0:
            return None
        rid = request.request_id
        if new_computed_block_ids:
            assert not request.block_ids, "prefix hits only on a request's first allocation"
            self.pool.touch([self.pool.blocks[i] for i in new_computed_block_ids])
            request.block_ids.extend(new_computed_block_ids)
        self._num_cached_blocks.setdefault(rid, len(new_computed_block_ids))
        stats = self._pending_stats.pop(rid, None)
        if stats is not None:
            self.prefix_cache_queries += stats[0]
            self.prefix_cache_hits += stats[1]
        total = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        n = max(self.blocks_needed(total) - len(request.block_ids), 0)
        new_ids = [b.block_id for b in self.pool.get_new_blocks(n)]
        request.block_ids.extend(new_ids)
        return new_ids

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Publishes the request's full blocks whose KV is computed (the first num_computed_tokens)."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        done = self._num_cached_blocks.get(rid, 0)
        num_full = min(num_computed_tokens // self.block_size, len(request.block_ids))
        if num_full <= done:
            return
        hashes = self.block_hashes(request)
        for i in range(done, num_full):
            self.pool.cache_block(self.pool.blocks[request.block_ids[i]], hashes[i])
        self._num_cached_blocks[rid] = num_full

    def free(self, request: Request) -> None:
        """Releases the request's blocks, last block first (see the module doc for the order), and its host
        blocks when it is swapped out."""
        self.pool.free_blocks([self.pool.blocks[i] for i in reversed(request.block_ids)])
        request.block_ids = []
        self._num_cached_blocks.pop(request.request_id, None)
        self._pending_stats.pop(request.request_id, None)
        self.swap_space.release(request.request_id)

    # ---- the RAM tier ----
    @property
    def num_cpu_blocks(self) -> int:
        return self.swap_space.num_blocks

    def is_swapped(self, request: Request) -> bool:
        return self.swap_space.holds(request.request_id)

    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Moves a request's whole block table to host blocks and frees its device blocks.

        Returns:
            (device block, host block) pairs in block-table order, to copy device -> host before anything
            writes the freed device blocks; None (nothing changes) when the request holds no blocks or
            the RAM tier has too few free blocks (the caller recomputes instead).
        """
        if not request.block_ids or self.is_swapped(request):
            return None
        host_ids = self.swap_space.take(request.request_id, len(request.block_ids))
        if host_ids is None:
            return None
        pairs = list(zip(request.block_ids, host_ids))
        self.pool.free_blocks([self.pool.blocks[i] for i in reversed(request.block_ids)])
        request.block_ids = []
        self._num_cached_blocks.pop(request.request_id, None)
        return pairs

    def can_swap_in(self, request: Request, num_new_tokens: int) -> bool:
        """Whether the device pool holds the swapped blocks plus the blocks of num_new_tokens more."""
        total = request.num_computed_tokens + num_new_tokens
        need = max(self.blocks_needed(total), len(self.swap_space.tables[request.request_id]))
        return need <= self.pool.num_free_blocks

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Gives a swapped-out request fresh device blocks for its host blocks (call can_swap_in first).

        Returns:
            (device block, host block) pairs in block-table order, to copy host -> device before the
            step runs; request.block_ids is the restored table (allocate_slots adds the new tokens' blocks).
        """
        assert not request.block_ids, "a swapped-out request holds no device blocks"
        host_ids = self.swap_space.release(request.request_id)
        request.block_ids = [b.block_id for b in self.pool.get_new_blocks(len(host_ids))]
        return list(zip(request.block_ids, host_ids))

    def take_state_copies(self) -> list[tuple[int, int]]:
        """State slots to copy before the step (hybrid_cache.py); none here."""
        return []

    def reset_prefix_cache(self) -> bool:
        """Drops every cached hash; always succeeds (held blocks stay allocated, just unshared)."""
        self.pool.reset_prefix_cache()
        return True


def num_blocks_for_budget(bytes_budget: int, bytes_per_block: int, block_size: int, max_model_len: int,
                          max_num_seqs: int) -> int:
    """How many KV blocks (null block included) to allocate for a byte budget.

    bytes_per_block: one block's K and V in every layer (core.kv_spec.bytes_per_block). Never more than
    max_num_seqs sequences of max_model_len tokens can use, plus the null block.
    Raises ValueError when the budget holds fewer than 2 blocks.
    """
    fits = int(bytes_budget // bytes_per_block)
    useful = max_num_seqs * cdiv(max_model_len, block_size) + 1
    n = min(fits, useful)
    if n < 2:
        raise ValueError(f"KV budget of {bytes_budget} bytes holds {fits} blocks of {bytes_per_block} bytes "
                         f"(block_size={block_size}); at least 2 are needed")
    return n
