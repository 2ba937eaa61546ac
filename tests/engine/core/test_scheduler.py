"""Scheduler with no model: budgets, chunked prefill, decode-first, preemption, aborts, stops, n > 1."""
import random

import pytest

from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from tests.engine.core.fake_requests import SP

EOS = 2


def make(num_blocks=64, block_size=4, budget=64, max_num_seqs=16, max_model_len=256, **kw):
    kv = KVCacheManager(num_blocks=num_blocks, block_size=block_size)
    return Scheduler(kv, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                     max_model_len=max_model_len, **kw)


def add(s, rid, prompt, **sp):
    r = Request(rid, prompt, SP(**sp), eos_token_ids=EOS)
    s.add_request(r)
    return r


def fake_token(req_id, pos):
    """A deterministic 'model': the token at position pos depends only on (request, pos), never EOS."""
    return 1000 + (sum(map(ord, req_id)) * 31 + pos) % 5000


def seq_len(x):
    """A scheduled sequence's context length after the step (BatchMetadata.seq_lens)."""
    return x.start_pos + x.num_tokens


def schedule(s):
    """(output, ids of the requests this schedule() preempted)."""
    running = [r.request_id for r in s.running]
    out = s.schedule()
    return out, {rid for rid in running if s.requests[rid].status is RequestStatus.PREEMPTED}


def step(s, token_fn=fake_token):
    out = s.schedule()
    sampled = {x.req_id: [token_fn(x.req_id, seq_len(x))] for x in out.scheduled if x.sample}
    return out, s.update_from_output(out, sampled)


def check_invariants(s):
    kv = s.kv
    held = {}
    for r in s.running:
        assert r.status is RequestStatus.RUNNING
        assert len(r.block_ids) == kv.blocks_needed(r.num_computed_tokens)
        assert 0 not in r.block_ids and len(set(r.block_ids)) == len(r.block_ids)
        for b in r.block_ids:
            held[b] = held.get(b, 0) + 1
    for r in s.waiting:
        assert r.block_ids == [] and r.num_computed_tokens == 0
    for b, n in held.items():
        assert kv.pool.blocks[b].ref_cnt == n
    assert kv.num_free_blocks + len(held) == kv.num_usable_blocks
    assert len(s.running) <= s.max_num_seqs


def test_chunked_prefill_budget_16():
    s = make(budget=16)
    add(s, "a", range(10, 50), max_tokens=3)  # 40 prompt tokens
    out, _ = step(s)
    x = out.scheduled[0]
    assert (x.start_pos, x.num_tokens, x.sample) == (0, 16, False)
    assert x.token_ids == tuple(range(10, 26)) and x.block_ids == (1, 2, 3, 4)
    out, _ = step(s)
    x = out.scheduled[0]
    assert (x.start_pos, x.num_tokens, x.sample) == (16, 16, False)
    assert x.block_ids == (1, 2, 3, 4, 5, 6, 7, 8)
    out, _ = step(s)
    x = out.scheduled[0]
    assert (x.start_pos, x.num_tokens, x.sample, seq_len(x)) == (32, 8, True, 40)
    assert s.requests["a"].output_token_ids == [fake_token("a", 40)]
    out, fin = step(s)  # decode: the last sampled token at position 40 opens block 11
    x = out.scheduled[0]
    assert (x.start_pos, x.token_ids, x.sample, x.block_ids[-1]) == (40, (fake_token("a", 40),), True, 11)
    out, fin = step(s)
    assert [(r.request_id, why) for r, why in fin] == [("a", "length")]
    assert fin[0][0].num_output_tokens == 3
    assert s.kv.usage == 0.0 and not s.has_unfinished_requests()
    assert s.schedule().scheduled == ()


def test_chunked_prefill_budget_64_two_requests():
    s = make(budget=64)
    add(s, "a", range(40), max_tokens=4)
    add(s, "b", range(100, 140), max_tokens=4)
    out, _ = step(s)
    assert [(x.req_id, x.num_tokens, x.sample) for x in out.scheduled] == [("a", 40, True), ("b", 24, False)]
    assert sum(x.num_tokens for x in out.scheduled) == 64
    out, _ = step(s)
    assert [(x.req_id, x.num_tokens, x.sample) for x in out.scheduled] == [("a", 1, True), ("b", 16, True)]
    assert sum(x.num_tokens for x in out.scheduled) == 17


def test_decodes_go_first():
    s = make(budget=16)
    add(s, "a", range(8), max_tokens=10)
    step(s)  # a prefilled, one token sampled
    add(s, "b", range(100, 164))
    out, _ = step(s)
    assert [(x.req_id, x.num_tokens) for x in out.scheduled] == [("a", 1), ("b", 15)]
    out, _ = step(s)
    assert [(x.req_id, x.num_tokens) for x in out.scheduled] == [("a", 1), ("b", 15)]


def test_long_prefill_threshold_and_max_num_seqs():
    s = make(budget=64, max_num_seqs=2, long_prefill_token_threshold=8)
    for rid in "abc":
        add(s, rid, range(20))
    out, _ = step(s)
    assert [(x.req_id, x.num_tokens) for x in out.scheduled] == [("a", 8), ("b", 8)]
    assert (s.num_running, s.num_waiting) == (2, 1)


def test_chunked_prefill_disabled():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make(budget=16, max_model_len=64, enable_chunked_prefill=False)
    s = make(budget=64, max_model_len=64, enable_chunked_prefill=False)
    add(s, "a", range(40))
    add(s, "b", range(100, 140))
    out, _ = step(s)
    assert [(x.req_id, x.num_tokens) for x in out.scheduled] == [("a", 40)]  # b does not fit whole
    out, _ = step(s)
    assert [(x.req_id, x.num_tokens) for x in out.scheduled] == [("a", 1), ("b", 40)]


def test_partial_chunks_never_sample_and_extra_tokens_are_ignored():
    s = make(budget=16)
    a = add(s, "a", range(20))
    out = s.schedule()
    assert not out.scheduled[0].sample
    s.update_from_output(out, {"a": [7]})  # a buggy runner's token for a partial chunk is dropped
    assert a.output_token_ids == []
    out = s.schedule()
    assert out.scheduled[0].sample
    with pytest.raises(ValueError, match="no sampled token"):
        s.update_from_output(out, {})


def test_preemption_with_tiny_pool_then_everything_finishes():
    # 8 usable blocks of 4 tokens; each request needs up to 4 + 12 - 1 = 15 tokens = 4 blocks.
    s = make(num_blocks=9, block_size=4, budget=32)
    prompts = {rid: [10 + i] * 2 + [20 + i, 30 + i] for i, rid in enumerate("abcd")}
    for rid, p in prompts.items():
        add(s, rid, p, max_tokens=12)
    done, preempted, steps = {}, set(), 0
    while s.has_unfinished_requests():
        out, now = schedule(s)
        fin = s.update_from_output(out, {x.req_id: [fake_token(x.req_id, seq_len(x))] for x in out.scheduled
                                         if x.sample})
        preempted |= now
        for pid in now:  # a preempted request does not run in the step that preempted it
            assert pid not in {x.req_id for x in out.scheduled}
        check_invariants(s)
        done.update({r.request_id: (r, why) for r, why in fin})
        steps += 1
        assert steps < 200
    assert preempted and s.num_preemptions >= 1
    assert sorted(done) == list("abcd")
    for rid, (r, why) in done.items():
        assert why == "length" and r.num_output_tokens == 12
        p = len(prompts[rid])
        # Recompute after preemption reproduces the same sequence.
        assert r.output_token_ids == [fake_token(rid, p + k) for k in range(12)]
    assert s.kv.usage == 0.0


def test_preempted_request_resumes_as_new_with_outputs():
    s = make(num_blocks=5, block_size=4, budget=32)  # 4 usable blocks
    add(s, "a", range(6), max_tokens=4)  # up to 9 KV tokens = 3 blocks
    add(s, "b", range(100, 106), max_tokens=8)
    out, _ = step(s)
    assert [x.req_id for x in out.scheduled] == ["a", "b"]  # 2 blocks each
    for _ in range(2):
        out, _ = step(s)
    assert [seq_len(x) for x in out.scheduled] == [8, 8]  # both blocks now full
    out, now = schedule(s)  # both need a third block: b (last arrived) is preempted, a takes b's tail block
    s.update_from_output(out, {"a": [fake_token("a", seq_len(out.scheduled[0]))]})
    assert now == {"b"} and [x.req_id for x in out.scheduled] == ["a"]
    b = s.requests["b"]
    assert b.status is RequestStatus.PREEMPTED and b.block_ids == [] and b.num_computed_tokens == 0
    assert s.waiting[0] is b
    while "a" in s.requests:
        out, _ = step(s)
    out, _ = step(s)
    x = out.scheduled[0]
    assert x.req_id == "b" and b.num_output_tokens == 4  # resumed with its 3 outputs, and sampled a 4th
    # b's first block was still in the prefix cache (its second one was evicted for a).
    assert x.start_pos == 4 and seq_len(x) == 9 and x.sample
    assert x.block_ids == (3, 4, 2) and x.token_ids == tuple(b.all_token_ids[4:9])
    assert b.num_cached_tokens == 0  # hits at the *first* schedule


def test_random_workload_never_hangs():
    rng = random.Random(0)
    for trial in range(6):
        s = make(num_blocks=rng.randint(6, 20), block_size=rng.choice([2, 4, 8]), budget=rng.choice([8, 16, 64]),
                 max_num_seqs=rng.randint(1, 6), max_model_len=48)
        for i in range(10):
            prompt = [rng.randint(3, 40) for _ in range(rng.randint(1, 30))]
            try:
                add(s, f"r{i}", prompt, max_tokens=rng.randint(1, 20))
            except ValueError as e:
                assert "KV cache has only" in str(e)
        for _ in range(2000):
            if not s.has_unfinished_requests():
                break
            step(s)
            check_invariants(s)
            if rng.random() < 0.02 and s.requests:
                s.abort_requests(rng.choice(list(s.requests)))
        assert not s.has_unfinished_requests(), trial
        assert s.kv.usage == 0.0


def test_abort_mid_prefill_frees_blocks():
    s = make(budget=16)
    a = add(s, "a", range(40))
    out = s.schedule()
    assert a.block_ids == [1, 2, 3, 4]
    assert s.abort_requests("a") == [a]
    assert a.status is RequestStatus.FINISHED_ABORTED and a.finish_reason == "abort"
    assert a.block_ids == [] and s.kv.usage == 0.0
    assert s.update_from_output(out, {}) == []  # the in-flight step's result is dropped
    assert s.kv.pool.cached == {}  # its half-written blocks were never published
    nxt = s.schedule()
    assert nxt.scheduled == () and "a" not in s.requests
    assert s.abort_requests(["a", "unknown"]) == []


def test_abort_waiting_and_finish_by_stop_string():
    s = make(budget=8, max_num_seqs=1)
    a = add(s, "a", range(4))
    b = add(s, "b", range(4))
    step(s)
    assert s.finish_requests("b", "abort") == [b] and s.num_waiting == 0
    assert s.finish_requests(["a"], "stop") == [a]  # the detokenizer found a stop string
    assert a.finish_reason == "stop" and not s.has_unfinished_requests()


def run_one(s, rid, prompt, tokens, **sp):
    """Feeds the given tokens one per step; returns (request, reason)."""
    r = add(s, rid, prompt, **sp)
    it = iter(tokens)
    while True:
        out = s.schedule()
        fin = s.update_from_output(out, {x.req_id: [next(it)] for x in out.scheduled if x.sample})
        if fin:
            return fin[0]


def test_stop_conditions():
    s = make()
    r, why = run_one(s, "eos", [5, 6], [7, EOS, 9])
    assert why == "stop" and r.output_token_ids == [7, EOS] and r.stop_reason is None
    r, why = run_one(s, "min", [5, 6], [EOS, EOS, 8, EOS], min_tokens=3)
    assert why == "stop" and r.output_token_ids == [EOS, EOS, 8, EOS]
    r, why = run_one(s, "ign", [5, 6], [EOS] * 5, ignore_eos=True, max_tokens=5)
    assert why == "length" and r.num_output_tokens == 5
    r, why = run_one(s, "stoptok", [5, 6], [7, 8, 42, 9], stop_token_ids=[42, 43])
    assert why == "stop" and r.output_token_ids == [7, 8, 42] and r.stop_reason == 42
    r, why = run_one(s, "stopmin", [5, 6], [42, 8, 42], stop_token_ids=[42], min_tokens=2)
    assert why == "stop" and r.output_token_ids == [42, 8, 42]
    r, why = run_one(s, "ign2", [5, 6], [7, 42], stop_token_ids=[42], ignore_eos=True)
    assert why == "stop"  # ignore_eos leaves stop_token_ids on
    r, why = run_one(s, "max", [5, 6], [7] * 9, max_tokens=4)
    assert why == "length" and r.num_output_tokens == 4


def test_max_model_len_stop_and_limits():
    s = make(max_model_len=16)
    r, why = run_one(s, "len", range(10), [7] * 20, max_tokens=None)
    assert why == "length" and r.num_tokens == 16 and r.max_tokens == 6
    r, why = run_one(s, "len2", range(10), [7] * 20, max_tokens=100)
    assert why == "length" and r.num_tokens == 16
    r, why = run_one(s, "full", range(16), [7])  # a prompt of exactly max_model_len yields one token
    assert why == "length" and r.num_output_tokens == 1
    with pytest.raises(ValueError, match="longer than max_model_len"):
        add(s, "long", range(17))


def test_add_request_rejections():
    s = make(num_blocks=5, block_size=4)  # 4 usable blocks = 16 tokens
    with pytest.raises(ValueError, match="KV cache has only 4"):
        add(s, "big", range(10), max_tokens=8)  # 17 KV tokens
    add(s, "ok", range(10), max_tokens=7)  # 16 KV tokens: fits exactly
    with pytest.raises(ValueError, match="already in use"):
        add(s, "ok", range(3))
    with pytest.raises(ValueError, match="empty prompt"):
        add(s, "empty", [])
    with pytest.raises(ValueError, match="max_tokens"):
        add(s, "zero", [1], max_tokens=0)


def test_n_children_share_prompt_blocks_in_a_later_step():
    s = make(block_size=4, budget=10)
    prompt = list(range(50, 60))  # 10 tokens: 2 full blocks + 2
    for k in range(3):
        add(s, f"p-{k}", prompt, max_tokens=4)
    out, _ = step(s)
    assert [(x.req_id, x.block_ids) for x in out.scheduled] == [("p-0", (1, 2, 3))]
    out, _ = step(s)
    # p-0 decodes first; p-1 and p-2 hit p-0's two full prompt blocks and compute only 2 tokens.
    assert [(x.req_id, x.start_pos, x.num_tokens, x.block_ids) for x in out.scheduled] == [
        ("p-0", 10, 1, (1, 2, 3)), ("p-1", 8, 2, (1, 2, 4)), ("p-2", 8, 2, (1, 2, 5))]
    assert [s.requests[f"p-{k}"].num_cached_tokens for k in (1, 2)] == [8, 8]
    assert [s.kv.pool.blocks[i].ref_cnt for i in (1, 2)] == [3, 3]
    stats = s.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (30, 16)
    assert stats.prefix_cache_hit_rate == pytest.approx(16 / 30)


def test_n_children_in_the_same_step_do_not_share():
    # Blocks are published only once computed, so children admitted together compute their own copy.
    s = make(block_size=4, budget=64)
    for k in range(3):
        add(s, f"p-{k}", range(50, 60), max_tokens=4)
    out, _ = step(s)
    assert [x.block_ids for x in out.scheduled] == [(1, 2, 3), (4, 5, 6), (7, 8, 9)]
    # The duplicates stay private; the first copy is the one published.
    assert s.kv.get_computed_blocks(Request("q", range(50, 60), SP()))[0] == [1, 2]


def test_stats_and_timestamps():
    s = make(budget=8)
    a = add(s, "a", range(4))
    b = add(s, "b", range(20))
    assert a.queue_time is None
    step(s)
    st = s.make_stats()
    assert (st.num_running, st.num_waiting, st.num_preemptions) == (2, 0, 0)
    assert st.kv_cache_usage == pytest.approx(2 / 63)  # a: 4 tokens, b: its first 4-token chunk
    assert a.queue_time >= 0 and a.first_scheduled_time >= a.arrival_time
    assert a.first_token_time is not None and b.first_token_time is None


def test_runner_may_return_numpy_ints():
    np = pytest.importorskip("numpy")
    s = make()
    r = add(s, "a", np.arange(5, 10), max_tokens=2)
    assert r.prompt_token_ids == [5, 6, 7, 8, 9] and type(r.prompt_token_ids[0]) is int
    out = s.schedule()
    s.update_from_output(out, {"a": np.array([11], dtype=np.int64)})
    out = s.schedule()
    fin = s.update_from_output(out, {"a": np.int64(12)})
    assert r.output_token_ids == [11, 12] and type(r.output_token_ids[1]) is int and fin == [(r, "length")]
