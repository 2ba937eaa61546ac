"""Swap preemption to a RAM tier, with no model: exact block ids and swap pairs, prefix-cache refcounts,
the full-tier fallback to recompute, and a simulated KV memory that checks every step attends to the
right tokens after swaps, reuse and prefix hits."""
import random

from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from tests.engine.core.test_kv_cache import SP, prefill, refs, req
from tests.engine.core.test_scheduler import EOS, fake_token, schedule, seq_len, step


def test_swap_out_and_back_in_exact_ids():
    kv = KVCacheManager(num_blocks=8, block_size=4, num_cpu_blocks=4)  # 7 usable device blocks
    a = req("a", range(10))
    prefill(kv, a)
    assert a.block_ids == [1, 2, 3]
    h0, h1 = kv.block_hashes(a)
    assert kv.swap_out(a) == [(1, 0), (2, 1), (3, 2)]
    assert a.block_ids == [] and kv.is_swapped(a) and a.num_computed_tokens == 10
    assert kv.swap_space.free_block_ids() == [3] and kv.swap_space.tables == {"a": [0, 1, 2]}
    # Freed like free(): the partial block to the head, the hashed ones to the tail (still findable).
    assert kv.pool.free_block_ids() == [3, 4, 5, 6, 7, 2, 1] and kv.usage == 0.0
    assert kv.pool.get_cached_block(h0).block_id == 1
    assert kv.swap_out(a) is None  # already out
    a.append_output_token_ids(99)
    assert kv.can_swap_in(a, 1)
    # Table position j comes back from host block j, whatever device block it lands in.
    assert kv.swap_in(a) == [(3, 0), (4, 1), (5, 2)]
    assert a.block_ids == [3, 4, 5] and not kv.is_swapped(a)
    assert kv.swap_space.free_block_ids() == [3, 0, 1, 2] and kv.swap_space.usage == 0.0
    assert kv.allocate_slots(a, 1) == [] and refs(kv, a.block_ids) == [1, 1, 1]
    a.num_computed_tokens = 11
    kv.cache_blocks(a, 11)
    # The old blocks 1 and 2 still hold these hashes: the swapped-in copies stay private.
    assert kv.pool.blocks[3].block_hash is None and kv.pool.get_cached_block(h1).block_id == 2
    kv.free(a)
    assert kv.num_free_blocks == 7 and kv.swap_space.num_free_blocks == 4


def test_shared_prefix_blocks_are_copied_and_keep_their_other_owner():
    kv = KVCacheManager(num_blocks=10, block_size=4, num_cpu_blocks=8)
    a = req("a", range(9))
    prefill(kv, a)
    b = req("b", list(range(8)) + [50, 51, 52])
    hit, new = prefill(kv, b)
    assert (hit, new) == ([1, 2], [4]) and refs(kv, [1, 2, 3, 4]) == [2, 2, 1, 1]
    assert kv.swap_out(b) == [(1, 0), (2, 1), (4, 2)]
    assert refs(kv, [1, 2, 3, 4]) == [1, 1, 1, 0] and a.block_ids == [1, 2, 3]
    assert kv.num_free_blocks == 6  # only b's own block came free
    b.append_output_token_ids(7)
    assert kv.can_swap_in(b, 1)
    pairs = kv.swap_in(b)
    assert [h for _, h in pairs] == [0, 1, 2] and not set(b.block_ids) & {1, 2, 3}
    assert refs(kv, b.block_ids) == [1, 1, 1] and refs(kv, [1, 2, 3]) == [1, 1, 1]


def test_full_or_absent_tier_and_abort_while_swapped():
    kv = KVCacheManager(num_blocks=8, block_size=4, num_cpu_blocks=2)
    a = req("a", range(10))
    prefill(kv, a)
    assert kv.swap_out(a) is None  # 3 blocks, 2 host blocks: nothing changes
    assert a.block_ids == [1, 2, 3] and refs(kv, [1, 2, 3]) == [1, 1, 1]
    assert kv.swap_space.free_block_ids() == [0, 1] and not kv.is_swapped(a)
    none = KVCacheManager(num_blocks=8, block_size=4)
    b = req("b", range(5))
    prefill(none, b)
    assert none.num_cpu_blocks == 0 and none.swap_out(b) is None
    c = req("c", range(20, 26))
    prefill(kv, c)
    assert kv.swap_out(c) == [(4, 0), (5, 1)] and kv.swap_space.num_free_blocks == 0
    kv.free(c)  # an abort while swapped out gives the host blocks back
    assert kv.swap_space.free_block_ids() == [0, 1] and not kv.is_swapped(c)


def make(num_blocks, num_cpu_blocks, block_size=4, budget=32, **kw):
    kv = KVCacheManager(num_blocks=num_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks)
    return Scheduler(kv, max_num_batched_tokens=budget, max_num_seqs=16, max_model_len=256, **kw)


def add(s, rid, prompt, **sp):
    r = Request(rid, prompt, SP(**sp), eos_token_ids=EOS)
    s.add_request(r)
    return r


def two_requests_until_b_is_preempted(num_cpu_blocks):
    """4 usable blocks; a and b fill 2 each, then a needs a third: b (last arrived) is preempted."""
    s = make(num_blocks=5, num_cpu_blocks=num_cpu_blocks)
    add(s, "a", range(6), max_tokens=4)
    b = add(s, "b", range(100, 106), max_tokens=8)
    for _ in range(3):
        step(s)
    assert s.requests["a"].block_ids == [1, 2] and b.block_ids == [3, 4] and b.num_computed_tokens == 8
    out, now = schedule(s)
    fin = s.update_from_output(out, {x.req_id: [fake_token(x.req_id, seq_len(x))] for x in out.scheduled if x.sample})
    return s, b, out, fin, now


def test_scheduler_swaps_instead_of_recomputing():
    s, b, out, fin, now = two_requests_until_b_is_preempted(num_cpu_blocks=4)
    assert now == {"b"} and out.blocks_to_swap_out == ((3, 0), (4, 1))
    assert out.blocks_to_swap_in == () and [x.req_id for x in out.scheduled] == ["a"]
    # b's second block is a's third in the same step: the copy out must run before the forward pass.
    assert out.scheduled[0].block_ids == (1, 2, 4)
    assert b.status is RequestStatus.PREEMPTED and b.block_ids == [] and b.num_computed_tokens == 8
    assert s.waiting[0] is b and s.make_stats().num_swapped == 1 and s.make_stats().cpu_kv_cache_usage == 0.5
    assert [r.request_id for r, _ in fin] == ["a"]  # a's 4th token: it frees [1, 2, 4]
    out, _ = step(s)
    assert out.blocks_to_swap_in == ((4, 0), (3, 1)) and out.blocks_to_swap_out == ()
    x = out.scheduled[0]
    assert (x.req_id, x.start_pos, x.token_ids, x.sample) == ("b", 8, (b.all_token_ids[8],), True)
    assert x.block_ids == (4, 3, 2)  # two blocks swapped back in, one new
    assert b.num_output_tokens == 4  # resumed with its 3 outputs, and sampled a 4th
    assert s.kv.swap_space.free_block_ids() == [2, 3, 0, 1]
    while s.has_unfinished_requests():
        step(s)
    assert b.output_token_ids == [fake_token("b", 6 + k) for k in range(8)]
    st = s.make_stats()
    assert (st.num_preemptions, st.num_swap_outs, st.num_swap_ins, st.num_swapped) == (1, 1, 1, 0)
    assert s.kv.usage == 0.0 and s.kv.swap_space.num_free_blocks == 4


def test_scheduler_recomputes_when_the_tier_is_full():
    s, b, out, _, now = two_requests_until_b_is_preempted(num_cpu_blocks=1)
    assert now == {"b"} and out.blocks_to_swap_out == ()
    assert b.num_computed_tokens == 0 and not s.kv.is_swapped(b)
    assert s.num_swap_outs == 0 and s.num_preemptions == 1


class FakeKV:
    """Device and host KV memory holding token ids: swaps copy them, each step writes its tokens."""

    def __init__(self, s):
        bs = s.kv.block_size
        self.s, self.bs = s, bs
        self.device = [[None] * bs for _ in range(s.kv.num_blocks)]
        self.host = [[None] * bs for _ in range(s.kv.num_cpu_blocks)]

    def run(self, out):
        assert not (out.blocks_to_swap_out and out.blocks_to_swap_in), "a step's swaps go one way"
        for d, h in out.blocks_to_swap_out:
            self.host[h] = list(self.device[d])
        for d, h in out.blocks_to_swap_in:
            self.device[d] = list(self.host[h])
        bs = self.bs
        for x in out.scheduled:
            tokens = self.s.requests[x.req_id].all_token_ids
            for p in range(x.start_pos):  # the context this step attends to
                assert self.device[x.block_ids[p // bs]][p % bs] == tokens[p], (x.req_id, p)
            for p, t in enumerate(x.token_ids, x.start_pos):
                self.device[x.block_ids[p // bs]][p % bs] = t


def check_swap_invariants(s):
    kv, held = s.kv, 0
    for r in s.running:
        assert len(r.block_ids) == kv.blocks_needed(r.num_computed_tokens) and not kv.is_swapped(r)
        held += len(r.block_ids)
    for r in s.waiting:
        assert r.block_ids == []
        if kv.is_swapped(r):
            assert r.num_computed_tokens > 0
            assert len(kv.swap_space.tables[r.request_id]) == kv.blocks_needed(r.num_computed_tokens)
        else:
            assert r.num_computed_tokens == 0
    assert sum(map(len, kv.swap_space.tables.values())) + kv.swap_space.num_free_blocks == kv.num_cpu_blocks
    assert kv.num_free_blocks + sum(1 for b in kv.pool.blocks[1:] if b.ref_cnt) == kv.num_usable_blocks


def test_random_workload_with_swaps_attends_to_the_right_tokens():
    rng = random.Random(1)
    swaps = recomputes = 0
    for trial in range(8):
        bs = rng.choice([2, 4])
        s = make(num_blocks=rng.randint(8, 16), num_cpu_blocks=rng.randint(2, 12), block_size=bs,
                 budget=rng.choice([8, 16, 64]))
        mem = FakeKV(s)
        shared = [rng.randint(3, 40) for _ in range(8)]  # a common prefix, so blocks are shared
        for i in range(10):
            prompt = shared[:rng.randint(0, 8)] + [rng.randint(3, 40) for _ in range(rng.randint(1, 12))]
            try:
                add(s, f"r{i}", prompt, max_tokens=rng.randint(1, 16))
            except ValueError as e:
                assert "KV cache has only" in str(e)
        resume_at = {}  # swapped-out request -> the position it must resume at
        for _ in range(2000):
            if not s.has_unfinished_requests():
                break
            out, now = schedule(s)
            mem.run(out)
            for x in out.scheduled:
                if x.req_id in resume_at:
                    assert x.start_pos == resume_at.pop(x.req_id), "a swapped-in request recomputed"
            for rid in now:
                r = s.requests[rid]
                if s.kv.is_swapped(r):
                    resume_at[rid] = r.num_computed_tokens
            sampled = {x.req_id: [fake_token(x.req_id, seq_len(x))] for x in out.scheduled if x.sample}
            s.update_from_output(out, sampled)
            check_swap_invariants(s)
            if rng.random() < 0.02 and s.requests:
                victim = rng.choice(list(s.requests))
                s.abort_requests(victim)
                resume_at.pop(victim, None)
        assert not s.has_unfinished_requests(), trial
        assert s.kv.usage == 0.0 and s.kv.swap_space.num_free_blocks == s.kv.num_cpu_blocks
        swaps += s.num_swap_outs
        recomputes += s.num_preemptions - s.num_swap_outs
    assert swaps > 0 and recomputes > 0  # both paths ran
