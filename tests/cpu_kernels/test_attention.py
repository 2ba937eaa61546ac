"""write_kv / paged_attention against a dense numpy reference, float16 conversions against numpy."""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import pytest
from numba import njit

from cpu_kernels import attention as A
from cpu_kernels import f16 as F
from cpu_kernels import kv_rows
from cpu_kernels.vec16 import _vhsum, _vhsum4_store, _vload
from engine.core.kv_spec import row_shape, storage_array_dtype


# ---------------------------------------------------------------- float16 conversions
@njit(cache=True)
def _soft_f16_to_f32(h):
    out = np.empty(h.shape[0], np.float32)
    for i in range(h.shape[0]):
        out[i] = F.f16_to_f32_soft(h[i])
    return out


@njit(cache=True)
def _soft_f32_to_f16(x):
    out = np.empty(x.shape[0], np.uint16)
    for i in range(x.shape[0]):
        out[i] = F.f32_to_f16_soft(x[i])
    return out


def _kernel_f16_to_f32(h):
    out = np.empty(h.shape[0], np.float32)
    F.f16_bits_to_f32_array(h, out)
    return out


def _kernel_f32_to_f16(x):
    out = np.empty(x.shape[0], np.uint16)
    F.f32_to_f16_bits_array(x, out)
    return out


def _same_f32(a, b):
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


@pytest.mark.parametrize("convert", [_soft_f16_to_f32, _kernel_f16_to_f32], ids=["soft", "kernel"])
def test_f16_to_f32_all_halfs(convert):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert _same_f32(convert(h), h.view(np.float16).astype(np.float32))


def _f32_probe_values():
    """Every half, the midpoints between neighbours (ties) and their float32 neighbours, randoms, edges."""
    halfs = np.arange(1 << 15, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    halfs = halfs[np.isfinite(halfs)]
    mids = ((halfs[:-1].astype(np.float64) + halfs[1:]) / 2).astype(np.float32)  # exact in float32
    up, down = np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))
    top = np.float32([65504.0, 65519.996, 65520.0, 65535.0, 65536.0, 1e6, 3.4e38, np.inf, np.nan])
    tiny = np.float32([2.0 ** -24, 2.0 ** -25, np.nextafter(np.float32(2.0 ** -25), np.float32(1)), 2.0 ** -26,
                       2.0 ** -14, 2.0 ** -15, 1e-45, 1e-40, 1e-10])
    rand = np.random.default_rng(7).integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([halfs, mids, up, down, top, tiny, rand])
    return np.concatenate([x, -x]).astype(np.float32)


@pytest.mark.parametrize("convert", [_soft_f32_to_f16, _kernel_f32_to_f16], ids=["soft", "kernel"])
def test_f32_to_f16_round_to_nearest_even(convert):
    x = _f32_probe_values()
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(np.float16)
    got = convert(x)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], ref.view(np.uint16)[~nan])
    assert np.all(np.isnan(got[nan].view(np.float16)))


# ---------------------------------------------------------------- a paged batch and its dense reference
@dataclass
class Batch:
    q: np.ndarray
    k_cache: np.ndarray
    v_cache: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    keys: list  # per sequence: K (L, Hkv, D) f64 as stored in the cache
    values: list


def as_cached(x: np.ndarray, cache_dtype) -> np.ndarray:
    """float64 of the values a cache of cache_dtype (a numpy type, or the storage name 'q8_0') keeps for f32 x."""
    if cache_dtype != "q8_0":
        return x.astype(cache_dtype).astype(np.float64)
    rows = x.reshape(-1, x.shape[-1])
    q8, out = np.zeros((len(rows), *row_shape(x.shape[-1], "q8_0")), np.uint8), np.zeros(rows.shape, np.float32)
    kv_rows.store_rows(rows, q8)
    kv_rows.load_rows(q8, out)
    return out.reshape(x.shape).astype(np.float64)


def make_batch(seqs, hq, hkv, d, block_size, cache_dtype, seed=0):
    """seqs: list of (context_len, q_len). Writes every sequence's K/V through write_kv into shuffled blocks.
    cache_dtype: a numpy type, or 'q8_0' (int8 KV's blocks)."""
    rng = np.random.default_rng(seed)
    nblocks = [-(-ctx // block_size) for ctx, _ in seqs]
    num_blocks = sum(nblocks) + 3
    ids = rng.permutation(num_blocks).astype(np.int32)
    max_blocks = max(nblocks) + 1
    block_tables = np.zeros((len(seqs), max_blocks), np.int32)
    k_cache = np.zeros((num_blocks, block_size, hkv, *row_shape(d, cache_dtype)), storage_array_dtype(cache_dtype)
                       if isinstance(cache_dtype, str) else cache_dtype)
    v_cache = np.zeros_like(k_cache)
    keys, values, qs, starts = [], [], [], [0]
    used = 0
    for s, (ctx, qlen) in enumerate(seqs):
        block_tables[s, :nblocks[s]] = ids[used:used + nblocks[s]]
        used += nblocks[s]
        k = rng.standard_normal((ctx, hkv, d)).astype(np.float32)
        v = rng.standard_normal((ctx, hkv, d)).astype(np.float32)
        pos = np.arange(ctx)
        slots = block_tables[s, pos // block_size].astype(np.int64) * block_size + pos % block_size
        A.write_kv(k, v, k_cache, v_cache, slots)
        keys.append(as_cached(k, cache_dtype))
        values.append(as_cached(v, cache_dtype))
        qs.append(rng.standard_normal((qlen, hq, d)).astype(np.float32))
        starts.append(starts[-1] + qlen)
    return Batch(np.concatenate(qs), k_cache, v_cache, np.array(starts, np.int32),
                 np.array([c for c, _ in seqs], np.int32), block_tables, keys, values)


def reference(b: Batch, scale, sliding_window=0, softcap=0.0, sinks=None):
    """Dense float64 attention; sinks (Hq,): a logit per head in the softmax's denominator only (gpt-oss)."""
    T, hq, d = b.q.shape
    hkv = b.k_cache.shape[2]
    out = np.zeros((T, hq, d))
    for s in range(len(b.seq_lens)):
        q0, q1 = b.query_start_loc[s], b.query_start_loc[s + 1]
        for i in range(q1 - q0):
            p = b.seq_lens[s] - (q1 - q0) + i
            lo = max(0, p - sliding_window + 1) if sliding_window else 0
            for h in range(hq):
                kvh = h // (hq // hkv)
                sc = b.keys[s][lo:p + 1, kvh] @ b.q[q0 + i, h].astype(np.float64) * scale
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                m = sc.max() if sinks is None else max(sc.max(), float(sinks[h]))
                w = np.exp(sc - m)
                den = w.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - m))
                out[q0 + i, h] = (w / den) @ b.values[s][lo:p + 1, kvh]
    return out


def run(b: Batch, scale, sliding_window=0, softcap=0.0, sinks=None):
    return A.paged_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale,
                             sliding_window, softcap, sinks=sinks)


def sink_logits(hq, seed=0):
    """Per-head sinks from far below the scores (no effect) to far above them (they take most of the weight)."""
    return (np.random.default_rng(seed).standard_normal(hq) * 3 + np.linspace(-30, 12, hq)).astype(np.float32)


# decode, prefill chunk continuing a cached prefix, fresh prefill, a long decode, a one-token prompt
MIXED = [(37, 1), (50, 13), (20, 20), (75, 1), (1, 1)]


@pytest.mark.parametrize("cache_dtype", [np.float16, np.float32], ids=["f16", "f32"])
@pytest.mark.parametrize("block_size", [16, 7])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 1), (3, 3)], ids=["gqa8:2", "mqa4:1", "mha"])
@pytest.mark.parametrize("window,cap", [(0, 0.0), (5, 0.0), (17, 0.0), (0, 3.0)], ids=["full", "w5", "w17", "cap"])
def test_paged_attention_matches_dense(cache_dtype, block_size, hq, hkv, window, cap):
    d = 40  # not a multiple of the vector width
    b = make_batch(MIXED, hq, hkv, d, block_size, cache_dtype, seed=block_size + hq)
    scale = 2.0 / np.sqrt(d)  # spread the softmax so that errors show
    out = run(b, scale, window, cap)
    assert out.shape == b.q.shape and out.dtype == np.float32
    np.testing.assert_allclose(out, reference(b, scale, window, cap), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("cache_dtype", [np.float16, np.float32], ids=["f16", "f32"])
@pytest.mark.parametrize("block_size", [16, 7])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (3, 3)], ids=["gqa8:2", "mha"])
@pytest.mark.parametrize("window", [0, 5], ids=["full", "w5"])
def test_paged_attention_with_sinks_matches_dense(cache_dtype, block_size, hq, hkv, window):
    """gpt-oss's attention sinks on sliding and full layers: each head's denominator gets exp(sink) more."""
    d = 40
    b = make_batch(MIXED, hq, hkv, d, block_size, cache_dtype, seed=block_size + hq)
    scale, sinks = 2.0 / np.sqrt(d), sink_logits(hq)
    out = run(b, scale, window, sinks=sinks)
    np.testing.assert_allclose(out, reference(b, scale, window, sinks=sinks), rtol=1e-5, atol=2e-6)
    assert np.abs(out - run(b, scale, window)).max() > 1e-2  # the sinks did move the outputs


def test_sinks_keep_rows_batch_invariant_and_need_one_per_head():
    b = make_batch(MIXED, 8, 2, 64, 16, np.float16, seed=11)
    sinks = sink_logits(8, seed=1)
    full = run(b, 0.125, 17, sinks=sinks)
    for s in range(len(MIXED)):
        q0, q1 = b.query_start_loc[s], b.query_start_loc[s + 1]
        assert np.array_equal(run(_sub_batch(b, s), 0.125, 17, sinks=sinks), full[q0:q1]), s
    with pytest.raises(ValueError, match="one logit per query head"):
        run(b, 0.125, sinks=sinks[:4])


def test_paged_attention_gemma_shape_decode():
    b = make_batch([(300, 1)], 4, 1, 256, 16, np.float16, seed=3)
    np.testing.assert_allclose(run(b, 256 ** -0.5), reference(b, 256 ** -0.5), rtol=1e-5, atol=2e-6)


def test_write_kv_stores_rows_and_skips_padding():
    rng = np.random.default_rng(0)
    k_cache = np.zeros((4, 3, 2, 8), np.float16)
    v_cache = np.zeros((4, 3, 2, 8), np.float32)
    k = rng.standard_normal((3, 2, 8)).astype(np.float32)
    v = rng.standard_normal((3, 2, 8)).astype(np.float32)
    A.write_kv(k, v, k_cache, v_cache, np.array([5, -1, 9], np.int64))
    assert np.array_equal(k_cache[1, 2], k[0].astype(np.float16))
    assert np.array_equal(k_cache[3, 0], k[2].astype(np.float16))
    assert np.array_equal(v_cache[1, 2], v[0]) and np.array_equal(v_cache[3, 0], v[2])
    assert np.count_nonzero(v_cache) == 2 * 2 * 8  # row 1 (slot -1) was not written
    with pytest.raises(ValueError):
        A.write_kv(k, v, k_cache, v_cache, np.array([5, 12, 0], np.int64))


def test_paged_attention_rejects_bad_metadata():
    b = make_batch([(10, 3)], 2, 1, 16, 4, np.float16)
    with pytest.raises(ValueError):  # q_len > seq_len
        A.paged_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, np.array([2], np.int32), b.block_tables, 1.0)
    with pytest.raises(ValueError):  # block id outside the cache
        A.paged_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables + 100, 1.0)
    with pytest.raises(ValueError):  # block table shorter than the context
        A.paged_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, np.array([40], np.int32),
                          b.block_tables, 1.0)


def _sub_batch(b: Batch, s: int) -> Batch:
    q0, q1 = b.query_start_loc[s], b.query_start_loc[s + 1]
    return Batch(b.q[q0:q1], b.k_cache, b.v_cache, np.array([0, q1 - q0], np.int32), b.seq_lens[s:s + 1],
                 b.block_tables[s:s + 1], b.keys[s:s + 1], b.values[s:s + 1])


@pytest.mark.parametrize("cache_dtype", [np.float16, np.float32], ids=["f16", "f32"])
def test_rows_are_batch_invariant(cache_dtype):
    b = make_batch(MIXED, 8, 2, 64, 16, cache_dtype, seed=11)
    full = run(b, 0.125, 17)
    for s in range(len(MIXED)):
        q0, q1 = b.query_start_loc[s], b.query_start_loc[s + 1]
        assert np.array_equal(run(_sub_batch(b, s), 0.125, 17), full[q0:q1]), s


@pytest.mark.parametrize("hq,hkv,bs", [(4, 1, 7), (3, 3, 7), (4, 1, 40)], ids=["mqa4:1", "mha", "blocks-of-40"])
def test_rows_invariant_to_chunking_and_threads(hq, hkv, bs):
    """Rows computed in other tiles, by other kernel variants (4 or 1 query vectors) or threads: same bits
    (blocks of 40 keys: the softmax sums three 16-lane chunks per block)."""
    b = make_batch([(45, 45)], hq, hkv, 64, bs, np.float16, seed=5)
    whole = run(b, 0.125)

    def rows(t0, t1):  # rows t0..t1-1 of the prompt as one chunk whose context ends at t1
        return Batch(b.q[t0:t1], b.k_cache, b.v_cache, np.array([0, t1 - t0], np.int32),
                     np.array([t1], np.int32), b.block_tables, b.keys, b.values)

    assert np.array_equal(np.concatenate([run(rows(0, 29), 0.125), run(rows(29, 45), 0.125)]), whole)
    assert np.array_equal(np.concatenate([run(rows(t, t + 1), 0.125) for t in range(40, 45)]), whole[40:])
    threads = numba.get_num_threads()
    try:
        outs = []
        for n in sorted({1, threads}):
            numba.set_num_threads(n)
            outs.append(run(rows(44, 45), 0.125))
    finally:
        numba.set_num_threads(threads)
    assert all(np.array_equal(o, whole[44:]) for o in outs)


@pytest.mark.parametrize("cache_dtype", [np.float16, "q8_0"], ids=["f16", "q8_0"])
def test_long_decode_rows_walk_their_kv_heads_together(cache_dtype):
    """Past ROW_GROUP_MIN_KEYS a decode row's kv heads walk its blocks together (one plan run): the rows still match
    dense attention, and a row gets the bits it gets as one of a prefill chunk's rows (a tile per kv head)."""
    ctx = A.ROW_GROUP_MIN_KEYS + 37
    b = make_batch([(ctx, 2), (ctx - 5, 1), (40, 1)], 8, 4, 32, 16, cache_dtype, seed=7)
    out = run(b, 0.2)
    np.testing.assert_allclose(out, reference(b, 0.2), rtol=1e-4, atol=1e-5)
    last = Batch(b.q[1:2], b.k_cache, b.v_cache, np.array([0, 1], np.int32), b.seq_lens[:1], b.block_tables[:1],
                 b.keys[:1], b.values[:1])
    assert np.array_equal(run(last, 0.2), out[1:2])
    items = np.array([[0, 1, 0, h, 0] for h in range(4)] + [[1, 1, 1, 0, 0]], np.int64)
    assert A._row_run(items, 0, 5, np.array([ctx - 1, 0], np.int64)) == 4  # the row's 4 kv heads, not the next row
    assert A._row_run(items, 0, 5, np.array([39, 0], np.int64)) == 1  # a short context: one kv head at a time


@njit
def _sums_both_ways(x):
    """Each row's lane sum by _vhsum, and by _vhsum4_store four rows at a time."""
    one, four = np.empty(x.shape[0], np.float32), np.empty(x.shape[0], np.float32)
    for r in range(0, x.shape[0], 4):
        a, b, c, d = _vload(x, r * 16), _vload(x, r * 16 + 16), _vload(x, r * 16 + 32), _vload(x, r * 16 + 48)
        one[r], one[r + 1], one[r + 2], one[r + 3] = _vhsum(a), _vhsum(b), _vhsum(c), _vhsum(d)
        _vhsum4_store(a, b, c, d, four, r)
    return one, four


def test_four_lane_sums_at_once_give_the_halving_trees_bits():
    # Magnitudes 1e-8..1e8 mixed: any other order of the additions rounds differently somewhere.
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4096, 16)) * 10.0 ** rng.integers(-8, 9, (4096, 16))).astype(np.float32)
    one, four = _sums_both_ways(x)
    assert one.view(np.uint32).tolist() == four.view(np.uint32).tolist()
    assert not np.array_equal(one, x.sum(axis=1, dtype=np.float32))  # the order does matter for these inputs
