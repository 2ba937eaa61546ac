"""The state slots of hybrid models (engine/core/state_cache.py, hybrid_cache.py): exact slot ids for live states,
snapshots at block boundaries, prefix hits cut to a checkpoint and restored by a copy, eviction with the blocks,
preemption and frees; the scheduler carries them as ints."""
import pytest

from engine.core.hybrid_cache import HybridKVCacheManager
from engine.core.scheduler import Scheduler
from engine.core.state_cache import StatePool
from tests.engine.core.test_kv_cache import req


def step(kv, r, n, hit=(), n_hit=0):
    """One step of n tokens for r (with a prefix hit on its first), as the scheduler and engine run it."""
    new = kv.allocate_slots(r, n, n_hit, list(hit))
    assert new is not None
    copies = kv.take_state_copies()
    snap = r.state_snapshot
    r.num_computed_tokens += n_hit + n
    kv.cache_blocks(r, r.num_computed_tokens)
    return copies, snap


def test_state_pool_takes_free_slots_then_evicts_least_recent_checkpoints():
    p = StatePool(4)
    assert p.num_usable == 3 and [p.take(), p.take()] == [1, 2]
    p.publish(b"a", 1)
    p.publish(b"b", 2)
    assert p.take() == 3 and p.num_available == 2
    assert p.lookup(b"a", touch=True) == 1  # "a" is now the most recently used
    p.pin(2)
    assert p.take() == 1 and p.lookup(b"a") is None  # "b" is pinned: "a" goes although more recent
    assert p.take() is None
    p.drop(b"b")  # its block was evicted while a step still reads it: freed after the read
    assert not p.free and 2 in p.orphans
    p.unpin(2)
    assert list(p.free) == [2]
    p.publish(b"c", p.take())
    p.reset()
    assert p.num_checkpoints == 0 and list(p.free) == [2]
    with pytest.raises(ValueError):
        StatePool(1)


def test_live_slots_snapshots_and_a_restored_prefix_hit():
    kv = HybridKVCacheManager(num_blocks=20, block_size=4, num_state_slots=6)
    a = req("a", range(10))
    assert kv.get_computed_blocks(a) == ([], 0)
    copies, snap = step(kv, a, 10)
    assert a.state_slot == 1 and copies == [] and snap == (8, 2)  # the last boundary in (0, 10]: token 8
    assert kv.states.lookup(a.block_hashes[1]) == 2 and a.state_snapshot == ()
    a.append_output_token_ids([7])
    copies, snap = step(kv, a, 1)  # token 10: no boundary crossed
    assert snap == ()
    a.append_output_token_ids([7])
    copies, snap = step(kv, a, 1)  # token 11: the boundary at 12, after the step's one row
    assert snap == (1, 3) and kv.states.lookup(a.block_hashes[2]) == 3

    b = req("b", list(range(9)) + [99, 98, 97])  # shares a's first 2 blocks (and token 8)
    hit, n_hit = kv.get_computed_blocks(b)
    assert (hit, n_hit) == (a.block_ids[:2], 8)
    copies, snap = step(kv, b, b.num_tokens - n_hit, hit, n_hit)
    assert b.state_slot == 4 and copies == [(2, 4)]  # the checkpoint at token 8 into b's own slot
    assert snap == (4, 5)  # tokens 8..11 reach the boundary at 12 (b's own block 2)
    kv.free(b)
    kv.free(a)
    assert list(kv.states.free) == [4, 1] and kv.states.num_checkpoints == 3  # live slots freed, checkpoints kept


def test_hit_is_cut_to_the_longest_run_ending_at_a_checkpoint():
    kv = HybridKVCacheManager(num_blocks=20, block_size=4, num_state_slots=6)
    a = req("a", range(13))
    step(kv, a, 6)   # boundary 4 -> checkpoint of block 0
    step(kv, a, 7)   # boundary 12 -> checkpoint of block 2 (none at 8)
    kv.states.drop(a.block_hashes[2])
    b = req("b", list(range(12)) + [50, 51])
    assert kv.get_computed_blocks(b) == (a.block_ids[:1], 4)  # blocks 0-2 cached, the last checkpoint at block 0


def test_a_block_evicted_from_the_pool_takes_its_checkpoint_along():
    kv = HybridKVCacheManager(num_blocks=4, block_size=4, num_state_slots=4)
    a = req("a", range(8))
    step(kv, a, 8)
    assert kv.states.num_checkpoints == 1
    kv.free(a)
    b = req("b", [50 + i for i in range(12)])
    assert kv.get_computed_blocks(b) == ([], 0)
    step(kv, b, 12)  # needs all 3 usable blocks: a's cached ones are evicted
    assert kv.states.lookup(a.block_hashes[1]) is None


def test_admission_waits_for_a_state_slot_and_preemption_frees_it():
    kv = HybridKVCacheManager(num_blocks=40, block_size=4, enable_prefix_caching=False, num_state_slots=3)
    s = Scheduler(kv, max_num_batched_tokens=100, max_num_seqs=8, max_model_len=64)
    for i in range(3):
        s.add_request(req(str(i), [10 * i + t for t in range(5)]))
    out = s.schedule()
    assert [(r.req_id, r.state_slot) for r in out.scheduled] == [("0", 1), ("1", 2)]  # 2 usable slots
    assert s.num_waiting == 1 and out.state_copies == ()
    s._preempt(s.running.pop(), [])
    assert list(kv.states.free) == [2] and s.waiting[0].request_id == "1" and s.waiting[0].state_slot == -1


def test_scheduler_hands_out_copies_and_snapshots():
    kv = HybridKVCacheManager(num_blocks=40, block_size=4, num_state_slots=8)
    s = Scheduler(kv, max_num_batched_tokens=100, max_num_seqs=8, max_model_len=64)
    s.add_request(req("a", range(9)))
    out = s.schedule()
    assert out.scheduled[0].state_snapshot == (8, 2)
    s.update_from_output(out, {"a": [1]})
    s.add_request(req("b", list(range(8)) + [40, 41]))
    out = s.schedule()
    b = next(r for r in out.scheduled if r.req_id == "b")
    assert out.state_copies == ((2, b.state_slot),) and b.start_pos == 8


def test_drafts_snapshot_the_state_before_them_and_roll_back_to_it():
    kv = HybridKVCacheManager(num_blocks=20, block_size=4, num_state_slots=6)
    a = req("a", range(6))
    step(kv, a, 6)  # a checkpoint at 4 (slot 2), live slot 1
    a.append_output_token_ids([7])
    free_before = kv.states.num_available
    # a step of 1 token and 3 drafts, crossing the boundary at 8: the snapshot is the rollback's, after 1 row
    assert kv.allocate_slots(a, 1) is not None and kv.hold_drafts(a, 1, 3)
    slot = a.state_snapshot[1]
    assert a.state_snapshot == (1, slot) and slot not in (1, 2) and kv.states.num_available == free_before - 1
    a.num_computed_tokens += 4
    kv.take_back_drafts(a, 3, 1)  # one draft taken, then a correction: back to the state after token 6
    assert a.num_computed_tokens == 7 and a.state_snapshot == ()
    kv.cache_blocks(a, a.num_computed_tokens)
    assert kv.states.num_checkpoints == 1  # the rollback state was not published as a checkpoint
    assert kv.take_state_copies() == [(slot, a.state_slot)] and kv.states.num_available == free_before
    a.append_output_token_ids([8, 9])  # the accepted draft and the correction run next step
    assert a.num_tokens - a.num_computed_tokens == 2
    # all drafts taken: nothing to copy, the slot is free at once
    assert kv.hold_drafts(a, 2, 2)
    a.num_computed_tokens += 4
    kv.take_back_drafts(a, 2, 2)
    assert a.num_computed_tokens == 11 and kv.take_state_copies() == [] and kv.states.num_available == free_before
    # freed with a rollback pending: the copy into its live slot goes too
    assert kv.hold_drafts(a, 1, 2)
    kv.take_back_drafts(a, 2, 0)
    kv.free(a)
    assert kv.take_state_copies() == [] and kv.states.num_available == free_before + 1
