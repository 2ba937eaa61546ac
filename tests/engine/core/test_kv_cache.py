"""Block pool and KV-cache manager: exact block ids, ref counts, prefix reuse, free order, LRU eviction."""
import pytest

from engine.core.kv_cache import (ROOT_HASH, BlockPool, KVCacheManager, hash_block_tokens,
                             num_blocks_for_budget)
from engine.core.request import Request
from tests.engine.core.fake_requests import SP, req


def prefill(kv, r):
    """Allocates the whole prompt (with any prefix hit) and marks it computed, as a step would."""
    hit, n_hit = kv.get_computed_blocks(r)
    new = kv.allocate_slots(r, r.num_tokens - n_hit, n_hit, hit)
    assert new is not None
    r.num_computed_tokens = r.num_tokens
    kv.cache_blocks(r, r.num_computed_tokens)
    return hit, new


def refs(kv, ids):
    return [kv.pool.blocks[i].ref_cnt for i in ids]


def test_null_block_reserved_and_exact_ids():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    assert kv.num_usable_blocks == 9 and kv.num_free_blocks == 9
    assert kv.pool.free_block_ids() == list(range(1, 10))
    r = req("a", range(10))
    assert kv.get_computed_blocks(r) == ([], 0)
    assert kv.allocate_slots(r, 10) == [1, 2, 3]
    assert r.block_ids == [1, 2, 3] and refs(kv, [1, 2, 3]) == [1, 1, 1]
    assert kv.usage == pytest.approx(3 / 9)
    r.num_computed_tokens = 10
    assert kv.allocate_slots(r, 2) == []  # slots 10, 11 still fit in block 3
    assert kv.allocate_slots(r, 3) == [4]  # slot 12 opens a block
    assert r.block_ids == [1, 2, 3, 4]


def test_chain_hash_is_stable_and_published_after_compute():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    r = req("a", range(10))
    kv.allocate_slots(r, 10)
    assert kv.pool.cached == {}  # nothing is published before its KV is computed
    r.num_computed_tokens = 10
    kv.cache_blocks(r, 10)
    h0 = hash_block_tokens(None, (0, 1, 2, 3))
    h1 = hash_block_tokens(h0, (4, 5, 6, 7))
    assert h0 == hash_block_tokens(ROOT_HASH, [0, 1, 2, 3]) and len(h0) == 32
    assert kv.pool.cached == {h0: kv.pool.blocks[1], h1: kv.pool.blocks[2]}  # block 3 is partial
    assert r.block_hashes == [h0, h1]


def test_prefix_reuse_exact_blocks_and_refcounts():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = req("a", range(10))
    prefill(kv, a)
    b = req("b", list(range(8)) + [99, 98, 97])
    hit, new = prefill(kv, b)
    assert hit == [1, 2] and new == [4]
    assert b.block_ids == [1, 2, 4]
    assert refs(kv, [1, 2, 3, 4]) == [2, 2, 1, 1]
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (21, 8)
    # Diverging at the first block means no hit at all (chain hash).
    c = req("c", [5] + list(range(1, 10)))
    assert kv.get_computed_blocks(c) == ([], 0)


def test_never_hits_the_whole_prompt():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    prefill(kv, req("a", range(12)))
    assert kv.get_computed_blocks(req("b", range(8))) == ([1], 4)  # last token recomputed
    assert kv.get_computed_blocks(req("c", range(9))) == ([1, 2], 8)


def test_cache_salt_and_prompt_logprobs_skip_sharing():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    prefill(kv, req("a", range(10)))
    salted = Request("s", range(10), SP(), max_model_len=1024, cache_salt="tenant-2")
    assert kv.get_computed_blocks(salted) == ([], 0)
    assert kv.get_computed_blocks(req("p", range(10), prompt_logprobs=1)) == ([], 0)
    assert kv.get_computed_blocks(req("b", range(10)))[1] == 8


def test_free_order_and_cached_blocks_survive():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = req("a", range(10))
    prefill(kv, a)
    assert kv.pool.free_block_ids() == [4, 5, 6, 7, 8, 9]
    kv.free(a)
    # Unhashed block 3 goes to the head; hashed ones to the tail, last block first.
    assert kv.pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2, 1]
    assert refs(kv, [1, 2, 3]) == [0, 0, 0] and a.block_ids == []
    assert kv.usage == 0.0
    # Finished request's blocks are still hit; touching takes them off the free list.
    b = req("b", range(10))
    hit, new = prefill(kv, b)
    assert hit == [1, 2] and new == [3]
    assert kv.pool.free_block_ids() == [4, 5, 6, 7, 8, 9]


def test_shared_block_freed_by_one_owner_stays_held():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a, b = req("a", range(10)), req("b", range(10))
    prefill(kv, a)
    prefill(kv, b)
    assert b.block_ids == [1, 2, 4]
    kv.free(a)
    assert refs(kv, [1, 2, 3]) == [1, 1, 0]
    assert kv.pool.free_block_ids()[0] == 3 and 1 not in kv.pool.free_block_ids()


def test_lru_eviction_order():
    kv = KVCacheManager(num_blocks=5, block_size=4)  # 4 usable blocks
    a, b = req("a", range(8)), req("b", range(100, 108))
    prefill(kv, a)
    assert a.block_ids == [1, 2]
    kv.free(a)
    assert kv.pool.free_block_ids() == [3, 4, 2, 1]
    prefill(kv, b)
    assert b.block_ids == [3, 4]
    kv.free(b)
    assert kv.pool.free_block_ids() == [2, 1, 4, 3]
    assert len(kv.pool.cached) == 4
    # New content needs 1 block: the least recently freed one (a's tail, block 2) is evicted.
    c = req("c", range(200, 203))
    prefill(kv, c)
    assert c.block_ids == [2]
    assert kv.get_computed_blocks(req("a2", range(9))) == ([1], 4)  # a's first block still cached
    assert kv.get_computed_blocks(req("b2", range(100, 109))) == ([3, 4], 8)
    # Next eviction takes block 1, then b's blocks (tail 4 before 3).
    d = req("d", range(300, 311))
    prefill(kv, d)
    assert d.block_ids == [1, 4, 3]
    assert kv.get_computed_blocks(req("a3", range(9))) == ([], 0)
    assert kv.get_computed_blocks(req("b3", range(100, 109))) == ([], 0)


def test_hit_refreshes_lru_position():
    kv = KVCacheManager(num_blocks=5, block_size=4)
    a, b = req("a", range(5)), req("b", range(100, 105))
    prefill(kv, a)  # blocks 1 (cached), 2 (partial)
    kv.free(a)
    prefill(kv, b)
    kv.free(b)
    # b took [2, 3]; its hashed block 2 goes to the tail, unhashed 3 to the head.
    assert kv.pool.free_block_ids() == [3, 4, 1, 2]
    a2 = req("a2", range(5))
    hit, _ = prefill(kv, a2)
    assert hit == [1]
    kv.free(a2)
    assert kv.pool.free_block_ids() == [3, 4, 2, 1]  # block 1, just used, is now evicted last


def test_allocate_returns_none_without_side_effects():
    kv = KVCacheManager(num_blocks=4, block_size=4)  # 3 usable
    a = req("a", range(8))
    prefill(kv, a)
    b = req("b", range(100, 109))
    assert not kv.can_allocate(b, 9)
    assert kv.allocate_slots(b, 9) is None
    assert b.block_ids == [] and kv.num_free_blocks == 1
    assert kv.can_allocate(b, 4) and kv.allocate_slots(b, 4) == [3]


def test_hit_on_free_cached_block_counts_against_free_space():
    kv = KVCacheManager(num_blocks=4, block_size=4)  # 3 usable
    a = req("a", range(8))
    prefill(kv, a)
    kv.free(a)  # blocks 1, 2 cached and free; 3 free
    b = req("b", list(range(8)) + [50] * 8)  # hits 2 blocks, needs 2 more: 4 > 3
    hit, n_hit = kv.get_computed_blocks(b)
    assert hit == [1, 2]
    assert kv.allocate_slots(b, 8, n_hit, hit) is None
    assert kv.num_free_blocks == 3 and refs(kv, [1, 2]) == [0, 0]


def test_reset_prefix_cache():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = req("a", range(10))
    prefill(kv, a)
    assert kv.reset_prefix_cache()
    assert kv.pool.cached == {} and all(b.block_hash is None for b in kv.pool.blocks)
    assert kv.get_computed_blocks(req("b", range(10))) == ([], 0)
    kv.free(a)
    assert kv.pool.free_block_ids()[:3] == [1, 2, 3]  # unhashed now: to the head


def test_prefix_caching_disabled():
    kv = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    prefill(kv, req("a", range(10)))
    assert kv.pool.cached == {}
    assert kv.get_computed_blocks(req("b", range(10))) == ([], 0)


def test_pool_validation():
    with pytest.raises(ValueError):
        BlockPool(1, 16)


def test_num_blocks_for_budget():
    # 2 (K, V) * 2 layers * 16 tokens * 4 heads * 8 dim * 2 bytes = 4096 bytes per block
    assert num_blocks_for_budget(40960, 4096, 16, max_model_len=4096, max_num_seqs=8) == 10
    # Capped at what max_num_seqs sequences of max_model_len tokens can use, + the null block.
    assert num_blocks_for_budget(10**12, 4096, 16, max_model_len=100, max_num_seqs=3) == 3 * 7 + 1
    with pytest.raises(ValueError, match="at least 2"):
        num_blocks_for_budget(4096, 4096, 16, max_model_len=100, max_num_seqs=3)
