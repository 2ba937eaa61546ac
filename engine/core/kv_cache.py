"""Paged KV-cache bookkeeping: a block pool with ref counts, prefix caching and LRU eviction.

Only block ids and counts live here (no arrays); the runner owns the cache tensors, shaped
(num_blocks, block_size, num_kv_heads, head_dim) per layer, and indexes them with these ids.

Block 0 is the null block: never handed out, so a block table padded with 0 and a slot mapping that
points padding rows at slot 0..block_size-1 never touch a live sequence (BatchMetadata: unused = 0).
A pool of num_blocks therefore has num_blocks - 1 usable blocks.

Prefix caching (vLLM v1's scheme): every full block of a request's tokens has a chain hash
    h_i = sha256(pickle((h_{i-1}, tuple(block tokens), extra_keys)))
with h_{-1} a fixed root and extra_keys = (cache_salt, LoRA adapter) on the first block, those the request has.
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

Cache groups (vLLM v1's KV cache groups, core/kv_spec.cache_groups): layers are grouped by sliding window (0 = full
attention, group 0 when there is one); each group has its own BlockPool and block ids, and each request one block
table per group (Request.block_tables; block_ids is group 0's). A sliding group's table keeps its length (position
p's block is still table[p // block_size]) but the blocks wholly before `first position - window + 1` of a step are
freed and their entries set to the null block as the request advances (allocate_slots), so a request holds about
window + step tokens there. Freed blocks were published when computed and stay findable until evicted. A prefix hit
of e blocks needs the full groups' blocks 0..e-1 and, in a sliding group, only the cdiv(window - 1, block_size)
blocks before e (what position e * block_size sees); the hit is shortened until every group has its blocks. The
RAM tier swaps one table per request: it is refused where a group slides.
"""
from __future__ import annotations

from typing import Sequence

from engine.core.block_pool import (NULL_BLOCK_ID, ROOT_HASH, BlockPool, KVCacheBlock,  # noqa: F401 (re-exported)
                                    cdiv, hash_block_tokens)
from engine.core.kv_swap import SwapSpace
from engine.core.request import Request


class KVCacheManager:
    """Allocates blocks to requests (stored on request.block_tables, one table per cache group) with prefix caching.

    Args:
        num_blocks: blocks of every group's pool (null block included): one count for all, or one per group.
        windows: each group's sliding window (0 = full attention), group 0 first (kv_spec.cache_groups order).
        num_cpu_blocks: the RAM tier's host blocks (0: preemption recomputes); refused where a group slides.
    """

    def __init__(self, num_blocks: int | Sequence[int], block_size: int = 16, enable_prefix_caching: bool = True,
                 num_cpu_blocks: int = 0, windows: Sequence[int] = (0,)):
        self.windows = tuple(int(w) for w in windows)
        counts = (num_blocks,) * len(self.windows) if isinstance(num_blocks, int) else tuple(num_blocks)
        if len(counts) != len(self.windows):
            raise ValueError(f"{len(counts)} block counts for {len(self.windows)} cache groups")
        if num_cpu_blocks and any(self.windows):
            raise ValueError("the RAM tier (num_cpu_blocks) is not supported for models with sliding-window layers "
                             "(their cache groups free blocks as requests advance); leave num_cpu_blocks at 0, "
                             "preemption then recomputes")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pools = [BlockPool(n, block_size, enable_prefix_caching) for n in counts]
        self.pool = self.pools[0]
        # Sliding groups: blocks before the window of position e * block_size, per hit of e blocks.
        self._window_blocks = [cdiv(w - 1, block_size) if w else None for w in self.windows]
        self.swap_space = SwapSpace(num_cpu_blocks)  # empty (0 blocks): preemption recomputes
        self._num_cached_blocks: dict[str, int] = {}  # request id -> leading blocks already in the hash map
        self._num_skipped: dict[str, list[int]] = {}  # request id -> per group, leading entries set to null
        self._pending_stats: dict[str, tuple[int, int]] = {}
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    # ---- sizes and stats (group 0's pool; usage: the fullest group's) ----
    @property
    def num_groups(self) -> int:
        return len(self.pools)

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
        return max(p.usage for p in self.pools)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def group_blocks_held(self, g: int, num_tokens: int, max_step_tokens: int) -> int:
        """Most blocks of group g a request with num_tokens of KV holds at once, in steps of max_step_tokens."""
        need = self.blocks_needed(num_tokens)
        w = self.windows[g]
        return need if not w else min(need, cdiv(w - 1 + max_step_tokens, self.block_size) + 1)

    def shortfall_alone(self, num_tokens: int, max_step_tokens: int) -> tuple[int, int] | None:
        """(blocks needed, blocks usable) of the first group whose whole pool cannot hold one request of num_tokens,
        or None where every group can."""
        for g, pool in enumerate(self.pools):
            need = self.group_blocks_held(g, num_tokens, max_step_tokens)
            if need > pool.num_usable_blocks:
                return need, pool.num_usable_blocks
        return None

    # ---- hashing ----
    def block_hashes(self, request: Request) -> list[bytes]:
        """Chain hashes of the request's full blocks (all tokens, outputs included), extended lazily."""
        hashes = request.block_hashes
        tokens = request.all_token_ids
        bs = self.block_size
        for i in range(len(hashes), len(tokens) // bs):
            parent = hashes[i - 1] if i else None
            extra = request.hash_extra_keys if i == 0 else ()
            hashes.append(hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs], extra))
        return hashes

    # ---- prefix hits ----
    def _hit_len(self, g: int, hashes: list[bytes], max_blocks: int) -> int:
        """Longest hit of at most max_blocks blocks that group g holds: every block before it (full attention), or
        the window's blocks just before it (sliding; scanned from the right as vLLM's SlidingWindowManager does)."""
        pool, need = self.pools[g], self._window_blocks[g]
        if need is None:
            n = 0
            while n < max_blocks and pool.get_cached_block(hashes[n]) is not None:
                n += 1
            return n
        if need == 0:
            return max_blocks
        run = 0
        for i in range(max_blocks - 1, -1, -1):
            if pool.get_cached_block(hashes[i]) is None:
                run = 0
                continue
            run += 1
            if run == need:
                return i + need
        return run  # blocks 0..run-1, fewer than the window's: all a hit of run blocks sees

    def _hit_table(self, g: int, hashes: list[bytes], num_blocks: int) -> list[int]:
        """Group g's table for a hit of num_blocks blocks (null where a sliding group no longer needs a block)."""
        skip = 0 if self._window_blocks[g] is None else max(0, num_blocks - self._window_blocks[g])
        pool = self.pools[g]
        return [NULL_BLOCK_ID] * skip + [pool.get_cached_block(h).block_id for h in hashes[skip:num_blocks]]

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix of a request that holds no blocks yet, in every group.

        Returns (group 0's block ids, num computed tokens), a whole number of blocks and never the whole
        prompt: at least the last token is recomputed so that it yields logits. Takes no reference;
        pass the result straight to allocate_slots (which finds the other groups' blocks of the same hit).
        """
        if (not self.enable_prefix_caching or request.skip_prefix_cache
                or getattr(request.sampling_params, "prompt_logprobs", None) is not None):
            return [], 0
        hashes = self.block_hashes(request)
        n = min((request.num_tokens - 1) // self.block_size, len(hashes))
        while True:  # a sliding group may shorten the hit, and a shorter hit may need other window blocks
            m = n
            for g in range(self.num_groups):
                m = self._hit_len(g, hashes, m)
            if m == n:
                break
            n = m
        self._pending_stats[request.request_id] = (request.num_tokens, n * self.block_size)
        return self._hit_table(0, hashes, n), n * self.block_size

    # ---- allocation ----
    def _tables(self, request: Request) -> list[list[int]]:
        tables = request.block_tables
        while len(tables) < self.num_groups:
            tables.append([])
        return tables

    def _skippable(self, request: Request, g: int, first_pos: int) -> tuple[int, int]:
        """Entries [from, to) of a sliding group's table wholly before the window of position first_pos, still held."""
        w = self.windows[g]
        if not w:
            return 0, 0
        done = self._num_skipped.get(request.request_id, [0] * self.num_groups)[g]
        to = min(max(0, first_pos - w + 1) // self.block_size, len(request.block_tables[g]))
        return done, max(done, to)

    def _num_blocks_short(self, request, num_new_tokens, num_new_computed_tokens, new_computed_block_ids) -> int:
        """The largest shortfall of blocks over the groups (<= 0: everything fits)."""
        tables = self._tables(request)
        total = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        n_hit = len(new_computed_block_ids)
        hashes = self.block_hashes(request) if n_hit else []
        short = -(1 << 62)
        for g, pool in enumerate(self.pools):
            hit = self._hit_table(g, hashes, n_hit) if g else list(new_computed_block_ids)
            num_new = max(self.blocks_needed(total) - len(tables[g]) - len(hit), 0)
            # A hit on a free cached block takes it off the free list too; skipped blocks we alone hold come back.
            revived = sum(1 for i in hit if i != NULL_BLOCK_ID and pool.blocks[i].ref_cnt == 0)
            lo, hi = self._skippable(request, g, request.num_computed_tokens)
            freed = sum(1 for i in tables[g][lo:hi] if i != NULL_BLOCK_ID and pool.blocks[i].ref_cnt == 1)
            short = max(short, num_new + revived - freed - pool.num_free_blocks)
        return short

    def can_allocate(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                     new_computed_block_ids: list[int] = ()) -> bool:
        return self._num_blocks_short(request, num_new_tokens, num_new_computed_tokens,
                                      new_computed_block_ids) <= 0

    def _free_skipped(self, request: Request) -> None:
        """Frees the sliding groups' blocks that the window of the request's next token has left behind."""
        skipped = self._num_skipped.setdefault(request.request_id, [0] * self.num_groups)
        for g, pool in enumerate(self.pools):
            lo, hi = self._skippable(request, g, request.num_computed_tokens)
            table = request.block_tables[g]
            pool.free_blocks([pool.blocks[i] for i in reversed(table[lo:hi]) if i != NULL_BLOCK_ID])
            table[lo:hi] = [NULL_BLOCK_ID] * (hi - lo)
            skipped[g] = hi

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_block_ids: list[int] = ()) -> list[int] | None:
        """Gives the request blocks for num_new_tokens more tokens after its computed ones, in every group, and
        frees the sliding groups' blocks that fall out of their window (for the step's first token).

        Args:
            num_new_computed_tokens, new_computed_block_ids: a prefix hit from get_computed_blocks
                (first allocation only).
        Returns:
            group 0's newly allocated block ids (maybe empty), appended to request.block_ids after the
            hit blocks; None when a pool is short (nothing changes then).
        """
        if self._num_blocks_short(request, num_new_tokens, num_new_computed_tokens, new_computed_block_ids) > 0:
            return None
        rid = request.request_id
        tables = self._tables(request)
        n_hit = len(new_computed_block_ids)
        if n_hit:
            assert not request.block_ids, "prefix hits only on a request's first allocation"
            hashes = self.block_hashes(request)
            for g, pool in enumerate(self.pools):
                hit = self._hit_table(g, hashes, n_hit) if g else list(new_computed_block_ids)
                pool.touch([pool.blocks[i] for i in hit if i != NULL_BLOCK_ID])
                tables[g].extend(hit)
                skip = hit.count(NULL_BLOCK_ID)
                self._num_skipped.setdefault(rid, [0] * self.num_groups)[g] = skip
        self._num_cached_blocks.setdefault(rid, n_hit)
        stats = self._pending_stats.pop(rid, None)
        if stats is not None:
            self.prefix_cache_queries += stats[0]
            self.prefix_cache_hits += stats[1]
        if not n_hit:
            self._free_skipped(request)
        total = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        out = []
        for g, pool in enumerate(self.pools):
            n = max(self.blocks_needed(total) - len(tables[g]), 0)
            new_ids = [b.block_id for b in pool.get_new_blocks(n)]
            tables[g].extend(new_ids)
            out.append(new_ids)
        return out[0]

    def hold_drafts(self, request: Request, num_new_tokens: int, num_drafts: int) -> bool:
        """Room for num_drafts speculative tokens after the step's num_new_tokens (already allocated); False, and the
        drafts do not run, when there is none."""
        return self.allocate_slots(request, num_new_tokens + num_drafts) is not None

    def take_back_drafts(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """After the step: the rejected drafts' KV is not the request's (written over later, never cached)."""
        request.num_computed_tokens -= num_drafts - num_accepted

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Publishes the request's full blocks whose KV is computed (the first num_computed_tokens), in every group
        (a sliding group's blocks are published before they can leave its window)."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        done = self._num_cached_blocks.get(rid, 0)
        num_full = min(num_computed_tokens // self.block_size, len(request.block_ids))
        if num_full <= done:
            return
        hashes = self.block_hashes(request)
        for g, pool in enumerate(self.pools):
            table = request.block_tables[g]
            for i in range(done, min(num_full, len(table))):
                if table[i] != NULL_BLOCK_ID:
                    pool.cache_block(pool.blocks[table[i]], hashes[i])
        self._num_cached_blocks[rid] = num_full

    def _release(self, request: Request) -> None:
        """Drops the request's blocks in every group, last block first (see the module doc for the order)."""
        for g, pool in enumerate(self.pools):
            if g < len(request.block_tables):
                pool.free_blocks([pool.blocks[i] for i in reversed(request.block_tables[g]) if i != NULL_BLOCK_ID])
        request.block_tables = [[] for _ in self.pools]
        self._num_cached_blocks.pop(request.request_id, None)
        self._num_skipped.pop(request.request_id, None)

    def free(self, request: Request) -> None:
        """Releases the request's blocks in every group, and its host blocks when it is swapped out."""
        self._release(request)
        self._pending_stats.pop(request.request_id, None)
        self.swap_space.release(request.request_id)

    # ---- the RAM tier (one group without a window: the constructor refuses the rest) ----
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
        self._release(request)
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
        for pool in self.pools:
            pool.reset_prefix_cache()
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
