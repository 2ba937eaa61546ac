"""Speculative drafts in the scheduler, with no model: they run with the last sampled token, the KV of rejected
ones is taken back (num_computed_tokens), and only accepted tokens' blocks enter the prefix cache."""
from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from tests.engine.core.fake_requests import SP

EOS = 2


def _decoding(block_size=4, budget=64, prompt=(5, 6, 7, 8, 9, 10)):
    kv = KVCacheManager(num_blocks=32, block_size=block_size)
    s = Scheduler(kv, max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=128)
    r = Request("a", list(prompt), SP(max_tokens=50), eos_token_ids=EOS)
    s.add_request(r)
    out = s.schedule()
    s.update_from_output(out, {"a": [11]})  # the prompt ran and sampled 11
    return s, kv, r


def test_drafts_run_with_the_last_token_and_rejected_ones_are_taken_back():
    s, kv, r = _decoding()
    r.spec_token_ids = [12, 13, 14]
    out = s.schedule()
    (x,) = out.scheduled
    assert x.token_ids == (11, 12, 13, 14) and x.spec_token_ids == (12, 13, 14) and x.start_pos == 6 and x.sample
    assert r.num_computed_tokens == 10 and r.spec_token_ids == []
    s.update_from_output(out, {"a": [12, 20]})  # 12 accepted, 13 rejected (20 instead)
    assert r.output_token_ids == [11, 12, 20] and r.num_computed_tokens == 8  # prompt, 11 and 12 computed
    (y,) = s.schedule().scheduled
    assert y.token_ids == (20,) and y.start_pos == 8


def test_only_blocks_of_accepted_tokens_are_cached():
    s, kv, r = _decoding()
    r.spec_token_ids = [12, 13, 14, 15, 16]
    out = s.schedule()
    s.update_from_output(out, {"a": [30]})  # nothing accepted: positions 7.. hold rejected drafts' KV
    assert r.num_computed_tokens == 7 and kv._num_cached_blocks["a"] == 1  # [5 6 7 8] only
    r.spec_token_ids = [31, 32]
    out = s.schedule()
    s.update_from_output(out, {"a": [31, 32, 33]})  # both accepted, and 33
    assert r.all_token_ids == [5, 6, 7, 8, 9, 10, 11, 30, 31, 32, 33] and r.num_computed_tokens == 10
    s.update_from_output(s.schedule(), {"a": [34]})
    assert kv._num_cached_blocks["a"] == 2  # [9 10 11 30] once its tokens were all known


def test_drafts_that_do_not_fit_the_budget_wait():
    s, kv, r = _decoding(budget=3, prompt=(5, 6, 7))
    r.spec_token_ids = [12, 13, 14]
    (x,) = s.schedule().scheduled
    assert x.token_ids == (11,) and x.spec_token_ids == ()


def test_a_preempted_request_drops_its_drafts():
    s, kv, r = _decoding()
    r.spec_token_ids = [12]
    s._preempt(s.running.pop(), [])
    assert r.spec_token_ids == []


def test_drafts_share_the_steps_rows():
    kv = KVCacheManager(num_blocks=64, block_size=4)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=128, spec_step_rows=8)
    reqs = [Request(f"r{i}", [5, 6, 7], SP(max_tokens=50), eos_token_ids=EOS) for i in range(3)]
    for r in reqs:
        s.add_request(r)
    out = s.schedule()
    s.update_from_output(out, {r.request_id: [11] for r in reqs})
    for r in reqs:
        r.spec_token_ids = [1, 2, 3, 4]
    # 3 decodes leave 5 rows: 1 draft each (5 // 3)
    assert [x.spec_token_ids for x in s.schedule().scheduled] == [(1,), (1,), (1,)]


def test_drafts_take_only_blocks_left_over_after_every_decode():
    """One free block: b's decode crosses into a new block and a's drafts would need one too. The decode gets it; the
    drafts wait (a draft never takes a decode's block, nor preempts anyone)."""
    kv = KVCacheManager(num_blocks=5, block_size=4)  # 4 usable blocks (block 0 is the null block)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64)
    a = Request("a", [5, 6, 7], SP(max_tokens=5), eos_token_ids=EOS)
    b = Request("b", [5, 6, 7, 8, 9, 10, 11, 12], SP(max_tokens=5), eos_token_ids=EOS)
    for r in (a, b):
        s.add_request(r)
    s.update_from_output(s.schedule(), {"a": [12], "b": [13]})  # a holds 1 block, b 2 (full): 1 free
    a.spec_token_ids = [1, 2, 3]  # a's decode fits its block; its drafts need a second one
    out = s.schedule()
    assert [(x.req_id, x.spec_token_ids) for x in out.scheduled] == [("a", ()), ("b", ())]
    assert all(r.status.name == "RUNNING" for r in (a, b)) and s.num_preemptions == 0
