"""The KV manager of models that keep a per-sequence state in some layers (linear attention) beside paged K/V in the
others: the block pool as in KVCacheManager, plus a StatePool (state_cache.py) behind the same interface.

- A request takes a live state slot at its first allocation (request.state_slot) and holds it until it finishes or is
  preempted (then recomputed: the RAM tier does not swap states, and the engine refuses --num-cpu-blocks for these
  models). A waiting request is admitted only when a slot is free or a checkpoint can be evicted.
- Prefix caching keeps working on block boundaries: a step whose tokens cross a boundary b * block_size saves the state
  there into a checkpoint slot (request.state_snapshot = (rows of the step before it, slot); one per request and step,
  the last boundary crossed), published under the hash of block b - 1 once the step has computed it (cache_blocks). A
  prefix hit is cut to its longest run of cached blocks that ends at a checkpoint, and the checkpoint is copied into the
  request's live slot before the step runs (take_state_copies). Both kinds are evicted with their blocks.
- The state at the scheduler's chunk ends is only checkpointed when they fall on a block boundary, as in vLLM: prompts
  sharing a prefix but cut elsewhere hit at the previous checkpoint (the latest boundary the first request's steps
  crossed), not at the longest shared run of blocks.
- Speculative drafts: a step that checks drafts snapshots the state after the request's own tokens (before the drafts)
  into a spare slot instead of a checkpoint. All drafts taken: the slot is freed. Some rejected: the state goes back
  to the snapshot (copied before the next step) and the accepted drafts are computed again in the next step, with
  the token after them.
The scheduler reads request.state_slot and request.state_snapshot into its ScheduledRequests (ints, as block ids).
"""
from __future__ import annotations

from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.core.state_cache import StatePool


class HybridKVCacheManager(KVCacheManager):
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True,
                 num_state_slots: int = 2):
        super().__init__(num_blocks, block_size, enable_prefix_caching, num_cpu_blocks=0)
        self.states = StatePool(num_state_slots)
        self.pool.on_evict = self.states.drop
        self._restore: dict[str, int] = {}  # request id -> checkpoint slot its pending prefix hit restores
        self._reading: dict[str, int] = {}  # request id -> checkpoint slot copied into it this step (pinned)
        self._snapshot_hash: dict[str, bytes] = {}  # request id -> hash its pending snapshot is published under
        self._copies: list[tuple[int, int]] = []
        self._rollback: dict[str, int] = {}  # request id -> slot holding its state before this step's drafts
        self._after_copies: list[int] = []  # rollback slots to free once their copies are handed out

    @property
    def num_state_slots(self) -> int:
        return self.states.num_slots

    # ---- prefix hits
    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The base hit cut to its longest run of blocks ending at a checkpoint (a hybrid hit needs the state there)."""
        hit, _ = super().get_computed_blocks(request)
        rid, hashes = request.request_id, request.block_hashes
        n = len(hit)
        while n and self.states.lookup(hashes[n - 1]) is None:
            n -= 1
        self._restore.pop(rid, None)
        if n:
            self._restore[rid] = self.states.lookup(hashes[n - 1], touch=True)
        if rid in self._pending_stats:
            self._pending_stats[rid] = (request.num_tokens, n * self.block_size)
        return hit[:n], n * self.block_size

    # ---- allocation
    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_block_ids: list[int] = ()) -> list[int] | None:
        """As KVCacheManager.allocate_slots, and: a live state slot for a request without one (None when no slot can
        be had), the copy of a prefix hit's checkpoint into it, and this step's snapshot."""
        rid = request.request_id
        src = self._restore.pop(rid, None) if new_computed_block_ids else None
        if src is not None:
            self.states.pin(src)  # not the slot this request's own allocation evicts
        if request.state_slot < 0 and self.states.num_available < 1:
            return self._unpin(src)
        new_ids = super().allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_block_ids)
        if new_ids is None:
            return self._unpin(src)
        if request.state_slot < 0:
            request.state_slot = self.states.take()
        if src is not None:
            self._copies.append((src, request.state_slot))
            self._reading[rid] = src
        start = request.num_computed_tokens + num_new_computed_tokens
        self._plan_snapshot(request, start, start + num_new_tokens)
        return new_ids

    def _unpin(self, src: int | None) -> None:
        if src is not None:
            self.states.unpin(src)
        return None

    def _plan_snapshot(self, request: Request, start: int, end: int) -> None:
        """A checkpoint slot for the state at the last block boundary in (start, end], unless that boundary has one
        already (or will this step), or taking a slot would leave none for an admission."""
        b = end // self.block_size
        if not self.enable_prefix_caching or b * self.block_size <= start or request.state_snapshot:
            return
        h = self.block_hashes(request)[b - 1]
        if self.states.lookup(h) is not None or h in self._snapshot_hash.values() or self.states.num_available < 2:
            return
        request.state_snapshot = (b * self.block_size - start, self.states.take())
        self._snapshot_hash[request.request_id] = h

    def take_state_copies(self) -> list[tuple[int, int]]:
        """(checkpoint slot, live slot) pairs to copy, in order, before this step's forward pass."""
        out, self._copies = self._copies, []
        for slot in self._after_copies:  # taken again at the earliest by the next schedule, after the copies ran
            self.states.release(slot)
        self._after_copies = []
        return out

    # ---- speculative drafts
    def hold_drafts(self, request: Request, num_new_tokens: int, num_drafts: int) -> bool:
        """As KVCacheManager.hold_drafts, and a slot for the state before the drafts (in place of this step's
        checkpoint, which is given up)."""
        rid = request.request_id
        if self.states.num_available < (0 if request.state_snapshot else 1) + 1:
            return False
        if KVCacheManager.allocate_slots(self, request, num_new_tokens + num_drafts) is None:  # blocks only
            return False
        if request.state_snapshot:
            self.states.release(request.state_snapshot[1])
            self._snapshot_hash.pop(rid, None)
        request.state_snapshot = (num_new_tokens, self.states.take())
        self._rollback[rid] = request.state_snapshot[1]
        return True

    def take_back_drafts(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        rid = request.request_id
        slot = self._rollback.pop(rid, None)
        if slot is None:
            return super().take_back_drafts(request, num_drafts, num_accepted)
        request.state_snapshot = ()  # not a checkpoint: cache_blocks publishes nothing of it
        if num_accepted == num_drafts:
            self.states.release(slot)
            return
        request.num_computed_tokens -= num_drafts  # the accepted drafts run again, from the state before them
        self._copies.append((slot, request.state_slot))
        self._after_copies.append(slot)

    # ---- after the step, and the end
    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Publishes the computed blocks, and this step's snapshot under its block's hash; releases the checkpoint the
        step read."""
        super().cache_blocks(request, num_computed_tokens)
        rid = request.request_id
        self._unpin(self._reading.pop(rid, None))
        if request.state_snapshot:
            self.states.publish(self._snapshot_hash.pop(rid), request.state_snapshot[1])
            request.state_snapshot = ()

    def free(self, request: Request) -> None:
        super().free(request)
        rid = request.request_id
        if request.state_slot >= 0:  # a pending rollback into it goes too (its slot is freed with the copies)
            self._copies = [(src, dst) for src, dst in self._copies if dst != request.state_slot]
            self.states.release(request.state_slot)
            request.state_slot = -1
        if request.state_snapshot:
            self.states.release(request.state_snapshot[1])
            request.state_snapshot = ()
            self._snapshot_hash.pop(rid, None)
            self._rollback.pop(rid, None)
        self._unpin(self._reading.pop(rid, None))
        self._restore.pop(rid, None)

    def swap_out(self, request: Request):
        return None  # states are recomputed, never swapped (the RAM tier holds K/V blocks only)

    def reset_prefix_cache(self) -> bool:
        super().reset_prefix_cache()
        self.states.reset()
        return True
