"""paged_attention's bf16 rows (long prefill chunks): the bf16 lane pieces against numpy, the rows against the
dense reference, bitwise invariance to tiling and threads, and which chunks the model layers send there."""
from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import njit

from cpu_kernels import attention as A
from cpu_kernels.activations import exp_f32
from cpu_kernels.bf16x32 import HAS_BF16_DOT, _bdot, _bload, _bround, _bsplat2, _bstore, _bzip
from cpu_kernels.vec16 import _vexp, _vload, _vstore
from engine.worker.batch import RowGroups
from tests.cpu_kernels.test_attention import MIXED, Batch, make_batch, reference, run


def _rne(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even (normal numbers)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@njit(cache=True)
def _pieces(x, acc, pairs, rounded, zipped, dots, splat_dots, exps):
    for i in range(0, x.shape[0], 32):
        a, b = _vload(x, i), _vload(x, i + 16)
        _bstore(rounded, i, _bround(a, b))
        _bstore(zipped, i, _bzip(a, b))
        _vstore(dots, i // 2, _bdot(_vload(acc, i // 2), _bload(rounded, i), _bload(pairs, i)))
        _vstore(splat_dots, i // 2, _bdot(_vload(acc, i // 2), _bload(rounded, i), _bsplat2(pairs, i + 6)))
    for i in range(0, x.shape[0], 16):
        _vstore(exps, i, _vexp(_vload(x, i)))


@njit(cache=True)
def _scalar_exp(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = exp_f32(x[i])
    return out


def test_bf16_lane_pieces_match_numpy():
    rng = np.random.default_rng(0)
    n = 32 * 256
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)
    x[:8] = [1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), 65280.0, 3.0, -0.0, 0.0, 2 ** -120]  # ties, zeros
    acc = rng.standard_normal(n // 2).astype(np.float32)
    pairs = _rne(rng.standard_normal(n).astype(np.float32))
    rounded, zipped = np.empty(n, np.uint16), np.empty(n, np.uint16)
    dots, splat_dots, exps = (np.empty(k, np.float32) for k in (n // 2, n // 2, n))
    _pieces(x, acc, pairs, rounded, zipped, dots, splat_dots, exps)
    assert np.array_equal(rounded, _rne(x))
    r = _rne(x).reshape(-1, 2, 16)  # per 32 lanes: a (16), b (16) -> a0 b0 a1 b1 ...
    assert np.array_equal(zipped, r.transpose(0, 2, 1).reshape(-1))
    # vdpbf16ps: acc + a[2i+1] * b[2i+1], then + a[2i] * b[2i]; bf16 products are exact in float32
    a, b = _f32(rounded), _f32(pairs)
    assert np.array_equal(dots, (acc + a[1::2] * b[1::2]) + a[0::2] * b[0::2])
    bs = np.repeat(b.reshape(-1, 32)[:, 6:8], 16, axis=0).reshape(-1, 2)
    assert np.array_equal(splat_dots, (acc + a[1::2] * bs[:, 1]) + a[0::2] * bs[:, 0])
    y = np.clip(x, -100, 100).astype(np.float32)
    exps_y = np.empty_like(y)
    _pieces(y, acc, pairs, rounded, zipped, dots, splat_dots, exps_y)
    assert np.array_equal(exps_y.view(np.uint32), _scalar_exp(y).view(np.uint32))  # the softmax's exp: same bits


def _flags(b: Batch, which) -> np.ndarray:
    f = np.zeros(len(b.seq_lens), np.uint8)
    f[list(which)] = 1
    return f


@pytest.mark.parametrize("block_size", [16, 7])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 1), (3, 3)], ids=["gqa8:2", "mqa4:1", "mha"])
@pytest.mark.parametrize("window,cap", [(0, 0.0), (5, 0.0), (17, 0.0), (0, 3.0)], ids=["full", "w5", "w17", "cap"])
def test_bf16_rows_match_dense(block_size, hq, hkv, window, cap):
    d = 40
    b = make_batch(MIXED, hq, hkv, d, block_size, np.float16, seed=block_size + hq)
    scale = 2.0 / np.sqrt(d)
    f32 = run(b, scale, window, cap)
    flags = _flags(b, (1, 2))  # the prefill chunks
    out = A.paged_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale,
                            window, cap, flags)
    ref = reference(b, scale, window, cap)
    # bf16 products: about 2^-9 relative per input; the outputs are averages of N(0, 1) values
    np.testing.assert_allclose(out, ref, rtol=0, atol=4e-2)
    rows = np.zeros(len(out), bool)
    for s in (1, 2):
        rows[b.query_start_loc[s]:b.query_start_loc[s + 1]] = True
    assert np.abs(out[rows] - ref[rows]).max() > 1e-4  # the flagged rows did take the bf16 products
    assert np.array_equal(out[~rows], f32[~rows])  # the others are the float32 rows, bit for bit


@pytest.mark.parametrize("window", [0, 5], ids=["full", "w5"])
def test_bf16_rows_with_sinks_match_dense(window):
    """gpt-oss's sinks on the bf16 rows: they enter the softmax's sum (in float32), not the bf16 products."""
    from tests.cpu_kernels.test_attention import sink_logits
    b = make_batch(MIXED, 8, 2, 40, 7, np.float16, seed=4)
    scale, sinks = 2.0 / np.sqrt(40), sink_logits(8, seed=2)
    out = A.paged_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale,
                            window, 0.0, _flags(b, (1, 2)), sinks=sinks)
    np.testing.assert_allclose(out, reference(b, scale, window, sinks=sinks), rtol=0, atol=4e-2)
    assert np.abs(out - reference(b, scale, window)).max() > 0.1  # the sinks did move the outputs


@pytest.mark.parametrize("hq,hkv,bs", [(4, 1, 7), (3, 3, 16), (4, 1, 40)], ids=["mqa4:1-odd", "mha", "blocks-of-40"])
def test_bf16_rows_invariant_to_chunking_and_threads(hq, hkv, bs):
    b = make_batch([(45, 45)], hq, hkv, 64, bs, np.float16, seed=7)
    one = np.ones(1, np.uint8)

    def rows(t0, t1):
        return A.paged_attention(b.q[t0:t1], b.k_cache, b.v_cache, np.array([0, t1 - t0], np.int32),
                                 np.array([t1], np.int32), b.block_tables, 0.125, 0, 0.0, one)

    whole = rows(0, 45)
    assert np.array_equal(np.concatenate([rows(0, 29), rows(29, 45)]), whole)
    assert np.array_equal(np.concatenate([rows(t, t + 1) for t in range(40, 45)]), whole[40:])
    threads = numba.get_num_threads()
    try:
        outs = []
        for n in sorted({1, threads}):
            numba.set_num_threads(n)
            outs.append(rows(0, 45))
    finally:
        numba.set_num_threads(threads)
    assert all(np.array_equal(o, whole) for o in outs)


def test_bf16_flags_need_one_per_sequence():
    b = make_batch(MIXED, 4, 1, 16, 16, np.float16)
    with pytest.raises(ValueError, match="one flag per sequence"):
        A.paged_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, 1.0, 0, 0.0,
                          np.ones(2, np.uint8))


def test_long_chunks_take_bf16_attention_where_their_matmuls_may():
    qsl = np.array([0, 1, 65, 70, 170], np.int32)  # a decode, a 64-row chunk, a 5-row chunk, a 100-row chunk
    x = np.zeros((170, 8), np.float32)
    auto = RowGroups(qsl, "auto").bf16_attention(x)
    if HAS_BF16_DOT:
        assert auto.tolist() == [0, 1, 0, 1]
        assert RowGroups(qsl, "bfloat16").bf16_attention(x).tolist() == [0, 1, 0, 1]
    else:
        assert auto is None
    assert RowGroups(qsl, "float32").bf16_attention(x) is None
    assert RowGroups(np.array([0, 1, 6], np.int32), "auto").bf16_attention(x[:6]) is None  # no long chunk
    assert RowGroups().bf16_attention(x) is None  # no rows given
