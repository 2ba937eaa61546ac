"""Cache groups: sliding-window layers' blocks freed as requests advance, prefix hits across groups, the pool split."""
import pytest

from engine.core.kv_cache import KVCacheManager
from engine.core.kv_spec import LayerKV, cache_groups, layer_groups, sliding_blocks_per_seq, split_pool
from engine.core.scheduler import Scheduler
from tests.engine.core.fake_requests import req


def step(kv, r, n):
    """Allocates n more tokens of r and marks them computed, as a scheduled step would."""
    assert kv.allocate_slots(r, n) is not None
    r.num_computed_tokens += n
    kv.cache_blocks(r, r.num_computed_tokens)


def held(table):
    return [b for b in table if b != 0]


def test_groups_by_window_full_first():
    layout = (LayerKV(2, 8, window=8), LayerKV(2, 8, window=8), LayerKV(2, 8), LayerKV(2, 8, window=4))
    assert [(g.window, g.layers) for g in cache_groups(layout)] == [(0, (2,)), (4, (3,)), (8, (0, 1))]
    assert layer_groups(layout) == (2, 2, 0, 1)
    assert [g.window for g in cache_groups((LayerKV(2, 8),) * 3)] == [0]


def test_sliding_group_frees_blocks_out_of_window():
    # window 6, block 4: a step starting at position p needs positions p - 5 .. on.
    kv = KVCacheManager(num_blocks=30, block_size=4, windows=(0, 6))
    r = req("a", range(40))
    step(kv, r, 10)  # positions 0..9: blocks 0..2 in both groups
    assert r.block_tables == [[1, 2, 3], [1, 2, 3]]
    step(kv, r, 3)  # first position 10 sees 5..: block 0 (0..3) leaves the window, block 1 (4..7) stays
    assert r.block_tables == [[1, 2, 3, 4], [0, 2, 3, 4]]
    assert kv.pools[1].blocks[1].ref_cnt == 0 and kv.pools[1].blocks[1].block_hash is not None  # freed, findable
    for _ in range(9):
        step(kv, r, 3)
    # 40 tokens: the full group holds all 10 blocks, the sliding one only those that meet the last window
    assert held(r.block_tables[0]) == list(range(1, 11))
    assert len(r.block_tables[1]) == 10 and len(held(r.block_tables[1])) <= 3
    assert r.block_tables[1][:7] == [0] * 7
    assert kv.pools[1].num_free_blocks == 29 - len(held(r.block_tables[1]))
    # decode: one token a step keeps the sliding group at most cdiv(5 + 1, 4) + 1 blocks
    r.append_output_token_ids([7] * 30)
    for _ in range(30):
        step(kv, r, 1)
        assert len(held(r.block_tables[1])) <= kv.group_blocks_held(1, 10 ** 6, 1) == 3
    assert len(held(r.block_tables[0])) == 18
    kv.free(r)  # preemption or finish: every group's blocks go back
    assert r.block_tables == [[], []]
    assert kv.pools[0].num_free_blocks == kv.pools[1].num_free_blocks == 29


def test_prefix_hit_takes_the_window_blocks_only():
    kv = KVCacheManager(num_blocks=30, block_size=4, windows=(0, 6))
    a = req("a", range(25))
    for _ in range(5):
        step(kv, a, 5)
    kv.free(a)
    b = req("b", list(range(24)) + [99, 98])
    hit, n = kv.get_computed_blocks(b)
    assert n == 24 and hit == a_full(kv, 6)
    assert kv.allocate_slots(b, 2, n, hit) is not None
    # position 24 sees 19..: blocks 4 and 5 of the sliding group (cdiv(5, 4) = 2 blocks before the hit point)
    assert b.block_tables[1][:4] == [0, 0, 0, 0]
    assert b.block_tables[1][4:6] == [kv.pools[1].get_cached_block(h).block_id for h in b.block_hashes[4:6]]
    assert all(kv.pools[1].blocks[i].ref_cnt == 1 for i in b.block_tables[1][4:])
    assert kv.prefix_cache_hits == 24


def a_full(kv, n):
    """The full group's cached blocks of the first n blocks of range(...)."""
    return [kv.pools[0].get_cached_block(h).block_id for h in kv_hashes(kv, n)]


def kv_hashes(kv, n):
    """Chain hashes of the first n blocks of the tokens 0, 1, 2, ..."""
    return kv.block_hashes(req("h", range(4 * n + 1)))[:n]


def test_hit_shortened_when_window_blocks_were_evicted():
    kv = KVCacheManager(num_blocks=(30, 8), block_size=4, windows=(0, 6))
    a = req("a", range(24))
    for _ in range(4):
        step(kv, a, 6)
    kv.free(a)
    # Another request takes the sliding pool's free blocks: the oldest freed (a's early blocks) go first.
    c = req("c", [500 + i for i in range(20)])
    step(kv, c, 20)
    # a's sliding blocks: only those still cached can serve a hit; block 5 (before position 24) was evicted
    cached = [kv.pools[1].get_cached_block(h) is not None for h in kv_hashes(kv, 6)]
    assert cached == [False, False, False, True, True, False]  # a's blocks 3 and 4 were freed last: still there
    b = req("b", list(range(24)) + [99])
    hit, n = kv.get_computed_blocks(b)
    # the longest e <= 6 whose two blocks before it (or all before it, e <= 2) are still in the sliding pool
    expect = max(e for e in range(7) if all(cached[max(0, e - 2):e]))
    assert n == 4 * expect < 24
    assert hit == [kv.pools[0].get_cached_block(h).block_id for h in kv_hashes(kv, expect)]
    # c holds 5 of the sliding pool's 7 blocks, the hit revives 2: no room for b's 2 new blocks, nothing changes
    assert kv.allocate_slots(b, 25 - n, n, hit) is None and b.block_tables == [[], []]
    assert kv.pools[1].num_free_blocks == 2
    kv.free(c)
    assert kv.allocate_slots(b, 25 - n, n, hit) is not None
    assert b.block_tables[0][:5] == hit and len(b.block_tables[0]) == 7
    window = [kv.pools[1].get_cached_block(h).block_id for h in kv_hashes(kv, 5)[3:]]
    assert b.block_tables[1][:5] == [0, 0, 0] + window and len(held(b.block_tables[1])) == 4


def test_sliding_only_model_and_refusals():
    kv = KVCacheManager(num_blocks=10, block_size=4, windows=(4,))
    r = req("a", range(30))
    for _ in range(6):
        step(kv, r, 5)
    assert len(r.block_ids) == 8 and len(held(r.block_ids)) <= 3  # group 0 slides: its table holds nulls
    kv.free(r)
    b = req("b", range(30))
    hit, n = kv.get_computed_blocks(b)  # window 4: only the block just before the hit point is needed
    assert n == 28 and hit[:6] == [0] * 6 and hit[6] != 0
    with pytest.raises(ValueError, match="RAM tier"):
        KVCacheManager(num_blocks=10, block_size=4, num_cpu_blocks=8, windows=(0, 8))
    with pytest.raises(ValueError, match="cache groups"):
        KVCacheManager(num_blocks=(10, 10, 10), block_size=4, windows=(0, 8))


def test_scheduler_admits_long_requests_by_the_window_bound():
    # The sliding pool (7 blocks) could never hold 100 tokens, but a request only needs its window and a step.
    kv = KVCacheManager(num_blocks=(40, 7), block_size=4, windows=(0, 6))
    s = Scheduler(kv, max_num_batched_tokens=8, max_num_seqs=2, max_model_len=200)
    s.add_request(req("a", range(100), max_tokens=20))
    steps = 0
    while s.has_unfinished_requests() and steps < 100:
        out = s.schedule()
        s.update_from_output(out, {x.req_id: [1] for x in out.scheduled if x.sample})
        steps += 1
    assert not s.has_unfinished_requests() and s.num_preemptions == 0
    with pytest.raises(ValueError, match="need 5 blocks"):  # cdiv(5 + 8, 4) + 1 = 5 > 4 usable
        Scheduler(KVCacheManager(num_blocks=(40, 5), block_size=4, windows=(0, 6)), max_num_batched_tokens=8,
                  max_model_len=200).add_request(req("b", range(100)))


def test_split_pool_gives_full_layers_what_sliding_ones_do_not_need():
    layout = tuple(LayerKV(1, 64, window=0 if (i + 1) % 6 == 0 else 512) for i in range(18))
    # 1000 blocks of 16 tokens in every layer: the 15 sliding layers need 4 x (cdiv(511 + 64, 16) + 1 + 512 / 16) + 1
    per = sliding_blocks_per_seq(512, 16, 64, 32768)
    assert per == 37
    full, sliding = split_pool(layout, 1000, 16, "fp16", 32768, 4, 64)
    assert sliding == 4 * (per + 32) + 1 == 277
    assert full == 1000 + (1000 - 277) * 15 // 3  # the freed sliding bytes go to the 3 full layers
    assert split_pool(layout, 100, 16, "fp16", 32768, 4, 64) == (100, 100)  # too small to split: as before
    assert split_pool(layout[:5], 100, 16, "fp16", 32768, 4, 64) == (100,)  # one group: nothing to split
