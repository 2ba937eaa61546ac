"""fp8 KV caches (kv_cache_dtype fp8_e4m3 in uint8, fp8_e5m2 in int8): the kernels' conversions against torch's
float8 types, and every attention path over an fp8 cache equal to the same path over a float32 cache holding the
values the bytes decode to."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from numba import njit

from cpu_kernels import attention as A
from cpu_kernels import attention_sdpa as S
from cpu_kernels import f16 as F
from tests.cpu_kernels.test_attention import make_batch

FORMATS = {np.uint8: (torch.float8_e4m3fn, 448.0), np.int8: (torch.float8_e5m2, 57344.0)}
SEQS = [(37, 1), (50, 13), (20, 20), (75, 40), (1, 1)]  # decodes, chunks after cached prefixes, prompts


@njit
def _encode_all(x, out):
    for i in range(x.shape[0]):
        out[i] = F._encode(x[i], out)


@njit
def _decode_all(b, out):
    for i in range(b.shape[0]):
        out[i] = F._load_f32(b[i])


def decoded(cache: np.ndarray) -> np.ndarray:
    """The float32 values of fp8 cache bytes (torch's float8 types as the oracle)."""
    return torch.from_numpy(cache).view(FORMATS[cache.dtype.type][0]).to(torch.float32).numpy()


@pytest.mark.parametrize("dtype", list(FORMATS), ids=["e4m3", "e5m2"])
def test_fp8_conversions_match_torch(dtype):
    """Every byte decodes to torch's value (NaN bytes aside); floats over 60 binades, zeros, the saturation
    boundaries and round-to-nearest-even ties encode to torch's byte of the value clamped to the finite range."""
    tdtype, top = FORMATS[dtype]
    every = np.arange(256, dtype=np.uint8).view(dtype)
    got = np.empty(256, np.float32)
    _decode_all(every, got)
    want = torch.from_numpy(every).view(tdtype).to(torch.float32).numpy()
    finite = np.isfinite(want)
    assert finite.sum() >= 248  # e4m3fn: 2 NaN bytes; e5m2: 2 infinities and 6 NaNs
    np.testing.assert_array_equal(got[finite], want[finite])
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200_000) * np.exp2(rng.integers(-30, 30, 200_000))).astype(np.float32)
    steps = torch.from_numpy(every).view(tdtype).to(torch.float32).numpy()
    steps = np.unique(steps[np.isfinite(steps)])
    ties = ((steps[1:] + steps[:-1]) / 2).astype(np.float32)  # halfway between neighbours: even mantissas win
    x = np.concatenate([x, ties, -ties, [0.0, -0.0, top, -top, top * 1.03, np.inf, -np.inf]]).astype(np.float32)
    out = np.empty(x.shape, dtype)
    _encode_all(x, out)
    ref = torch.from_numpy(np.clip(x, -top, top)).to(tdtype).view(torch.uint8).numpy().view(dtype)
    np.testing.assert_array_equal(out, ref)


def _pair(dtype, block_size, hq, hkv, seed):
    """A batch written through write_kv into an fp8 cache, and the same batch over float32 caches holding the
    decoded bytes."""
    b = make_batch(SEQS, hq, hkv, 40, block_size, dtype, seed=seed)
    ref = make_batch(SEQS, hq, hkv, 40, block_size, np.float32, seed=seed)
    ref.k_cache[:], ref.v_cache[:] = decoded(b.k_cache), decoded(b.v_cache)
    return b, ref


@pytest.mark.parametrize("dtype", list(FORMATS), ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("block_size", [16, 7])
@pytest.mark.parametrize("hq,hkv,window", [(8, 2, 0), (4, 1, 17), (3, 3, 5)])
def test_attention_over_fp8_is_attention_over_its_values(dtype, block_size, hq, hkv, window):
    """The float32 rows, the bf16 rows of long chunks and torch's SDPA: the same bits as over float32 caches of the
    decoded values (the conversion is exact and every path reads a block's values once)."""
    b, ref = _pair(dtype, block_size, hq, hkv, seed=block_size + hq)
    assert b.k_cache.dtype == dtype and np.abs(decoded(b.k_cache)).max() > 1
    args = (b.query_start_loc, b.seq_lens, b.block_tables, 0.3, window)
    np.testing.assert_array_equal(A.paged_attention(b.q, b.k_cache, b.v_cache, *args),
                                  A.paged_attention(b.q, ref.k_cache, ref.v_cache, *args))
    flags = np.array([0, 1, 1, 1, 0], np.uint8)
    np.testing.assert_array_equal(A.paged_attention(b.q, b.k_cache, b.v_cache, *args, 0.0, flags),
                                  A.paged_attention(b.q, ref.k_cache, ref.v_cache, *args, 0.0, flags))
    np.testing.assert_array_equal(S.mixed_attention(b.q, b.k_cache, b.v_cache, *args, flags),
                                  S.mixed_attention(b.q, ref.k_cache, ref.v_cache, *args, flags))
    # and the bytes are close to the written values: e4m3 keeps 3 mantissa bits, e5m2 2
    fresh = make_batch(SEQS, hq, hkv, 40, block_size, np.float32, seed=block_size + hq)
    err = np.abs(decoded(b.k_cache) - fresh.k_cache).max()
    assert 0 < err <= {np.uint8: 2 ** -4, np.int8: 2 ** -3}[dtype] * np.abs(fresh.k_cache).max()
