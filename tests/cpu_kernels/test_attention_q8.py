"""int8 KV caches (kv_cache_dtype int8 / q8_0): the rows are the bytes gguf's Q8_0 quantizer writes and read back as
gguf dequantizes them, and every attention path over a q8_0 cache equals the same path over a float32 cache holding
the values the blocks decode to."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, dequantize, quantize

from cpu_kernels import attention as A
from cpu_kernels import attention_sdpa as S
from cpu_kernels import kv_rows, mla, rope
from tests.cpu_kernels.test_attention import as_cached, make_batch, reference

SEQS = [(37, 1), (50, 13), (20, 20), (75, 40), (1, 1)]  # decodes, chunks after cached prefixes, prompts
Q8_0 = GGMLQuantizationType.Q8_0


def decoded(cache: np.ndarray) -> np.ndarray:
    """The float32 values of a q8_0 cache (gguf's dequantize as the oracle), shaped (..., D)."""
    flat = dequantize(cache.reshape(-1, cache.shape[-2] * cache.shape[-1]), Q8_0)
    return flat.reshape(*cache.shape[:-2], -1).astype(np.float32)


def test_q8_rows_are_gguf_q8_0():
    """Rows over 40 binades, zero rows, a block with one value, ties of round(x / d): gguf's bytes, and gguf's
    values back."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((300, 128)) * np.exp2(rng.integers(-20, 20, (300, 1)))).astype(np.float32)
    x[0] = 0
    x[1, :32] = 0
    x[1, 5] = -3.0
    x[2] = np.arange(128, dtype=np.float32) - 63.5  # d = 64.5 / 127: many values near .5 steps
    q8 = np.zeros((300, 4, 34), np.uint8)
    kv_rows.store_rows(x, q8)
    np.testing.assert_array_equal(q8.reshape(300, -1), quantize(x, Q8_0))
    back = np.zeros(x.shape, np.float32)
    kv_rows.load_rows(q8, back)
    np.testing.assert_array_equal(back, decoded(q8))
    assert np.abs(back - x).max(axis=1).max() <= np.abs(x).max() / 254 * 1.01


@pytest.mark.parametrize("block_size", [16, 7])
@pytest.mark.parametrize("hq,hkv,d,window", [(8, 2, 64, 0), (4, 1, 96, 17), (3, 3, 32, 5)])
def test_attention_over_q8_is_attention_over_its_values(block_size, hq, hkv, d, window):
    """The float32 rows, the bf16 rows of long chunks and torch's SDPA: the same bits as over float32 caches of the
    decoded values; and close to dense float64 attention over them."""
    b = make_batch(SEQS, hq, hkv, d, block_size, "q8_0", seed=block_size + hq)
    ref = make_batch(SEQS, hq, hkv, d, block_size, np.float32, seed=block_size + hq)
    assert b.k_cache.shape == (*ref.k_cache.shape[:3], d // 32, 34)
    ref.k_cache[:], ref.v_cache[:] = decoded(b.k_cache), decoded(b.v_cache)
    args = (b.query_start_loc, b.seq_lens, b.block_tables, 0.3, window)
    got = A.paged_attention(b.q, b.k_cache, b.v_cache, *args)
    np.testing.assert_array_equal(got, A.paged_attention(b.q, ref.k_cache, ref.v_cache, *args))
    np.testing.assert_allclose(got, reference(b, 0.3, window), rtol=0, atol=2e-5)
    flags = np.array([0, 1, 1, 1, 0], np.uint8)
    np.testing.assert_array_equal(A.paged_attention(b.q, b.k_cache, b.v_cache, *args, 0.0, flags),
                                  A.paged_attention(b.q, ref.k_cache, ref.v_cache, *args, 0.0, flags))
    np.testing.assert_array_equal(S.mixed_attention(b.q, b.k_cache, b.v_cache, *args, flags),
                                  S.mixed_attention(b.q, ref.k_cache, ref.v_cache, *args, flags))
    # and the blocks hold the written values to int8's step: amax / 254 per block of 32
    fresh = make_batch(SEQS, hq, hkv, d, block_size, np.float32, seed=block_size + hq)
    err = np.abs(decoded(b.k_cache) - fresh.k_cache).max()
    assert 0 < err <= np.abs(fresh.k_cache).max() / 254 * 1.01


def test_latent_rows_into_q8_are_the_float_rows_quantized():
    """MLA's latent rows (RMSNorm(latent) | roped key) stored as q8_0: the rows of a float32 cache, quantized."""
    T, L, R, H = 6, 64, 32, 2
    rng = np.random.default_rng(3)
    y = rng.standard_normal((T, 3 * H * (L + R))).astype(np.float32)
    w = rng.standard_normal(L).astype(np.float32)
    inv_freq = (1.0 / 10000 ** (np.arange(0, R, 2) / R)).astype(np.float32)
    cos, sin = rope.rope_cos_sin(np.arange(T, dtype=np.int64), inv_freq, 1.0)
    slots = np.array([3, 0, 9, 4, 5, 11], np.int64)
    f32 = np.zeros((3, 4, 1, L + R), np.float32)
    q8 = np.zeros((3, 4, 1, (L + R) // 32, 34), np.uint8)
    for cache in (f32, q8):
        mla.write_latents((y, 5), (w, 1e-6), cos, sin, cache, slots)
    want = np.zeros(q8.shape, np.uint8).reshape(12, -1, 34)
    kv_rows.store_rows(f32.reshape(12, -1), want)
    np.testing.assert_array_equal(q8.reshape(12, -1, 34), want)
    assert np.abs(as_cached(f32, "q8_0") - f32).max() > 0  # the test sees the rounding


def test_write_kv_refuses_slots_past_a_q8_cache():
    cache = np.zeros((2, 4, 1, 1, 34), np.uint8)
    k = np.ones((1, 1, 32), np.float32)
    with pytest.raises(ValueError, match="slot outside the cache"):
        A.write_kv(k, k, cache, cache.copy(), np.array([8], np.int64))
