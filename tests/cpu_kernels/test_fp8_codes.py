"""FP8_E4M3 weights as codes (cpu_kernels/quant/fp8_codes.py): every byte's words, and GEMVs over rows full of the
values the words cannot carry (subnormals, zeros, both signs) against float64."""
import numpy as np
import pytest
from numba import njit

from cpu_kernels.quant import fp8_codes as fc
from cpu_kernels.quant.linear import QuantLinear
from cpu_kernels.quant.simd_lanes import lane
from cpu_kernels.quant.qtypes import RamlmType, e4m3_to_f32, fp8_rows

BYTES = np.array([b for b in range(256) if b not in (0x7F, 0xFF)], np.uint8)  # NaN's codes: no checkpoint holds them
SUBNORMAL = np.array([s | m for s in (0, 0x80) for m in range(1, 8)], np.uint8)


def test_code_round_trip_and_subnormals():
    b = np.arange(256, dtype=np.uint8)
    codes = np.array([fc.code_of(v) for v in b], np.uint8)
    assert sorted(codes) == list(range(256))
    np.testing.assert_array_equal([fc.e4m3_of(c) for c in codes], b)
    assert {int(v) for v in b if fc.is_subnormal(v)} == set(SUBNORMAL.tolist())


needs_codes = pytest.mark.skipif(not fc.CODE_LAYOUT, reason="codes are the AVX-512 VBMI + BF16 layout")


@njit
def _words(q, sub):
    out = np.empty(q.size, np.int16)
    for c in range(0, q.size, 64):
        a, b = fc.code_subnormal_bf16x64(q, c) if sub else fc.code_bf16x64(q, c)
        for j in range(32):
            out[c + j], out[c + 32 + j] = lane(a, j), lane(b, j)
    return out.view(np.uint16)


def _as_f32(words):
    return (words.astype(np.uint32) << 16).view(np.float32)


@needs_codes
@pytest.mark.parametrize("sub", [False, True], ids=["words", "subnormal_words"])
def test_every_code_becomes_its_bfloat16(sub):
    """A word per code, in CODE_ORDER: value * 2**-120 (subnormals aside: denormals vdpbf16ps reads as zero), or the
    subnormals' value * 2**-8 and zero for the rest."""
    raw = np.arange(256, dtype=np.uint8)
    q = np.array([fc.code_of(v) for v in raw], np.uint8)
    got = _as_f32(_words(q, sub)).reshape(4, 64)
    want = e4m3_to_f32(raw).astype(np.float64).reshape(4, 64)[:, fc.CODE_ORDER]
    is_sub = np.isin(raw, SUBNORMAL).reshape(4, 64)[:, fc.CODE_ORDER]
    nan = np.isnan(want)
    if sub:
        np.testing.assert_array_equal(got, np.where(is_sub, want * 2.0 ** -8, 0))
    else:
        np.testing.assert_array_equal(got[~is_sub & ~nan], want[~is_sub & ~nan] * 2.0 ** -120)
        assert (np.abs(got[is_sub]) < 2.0 ** -126).all()


def _rows(rng, N, K):
    """e4m3 rows mixing normals, zeros and subnormals, with whole blocks of subnormals (a dot made of them alone)."""
    q = rng.choice(BYTES, size=(N, K))
    q[rng.random((N, K)) < 0.2] = rng.choice(SUBNORMAL, size=1)[0]
    q[rng.random((N, K)) < 0.1] = rng.choice(np.array([0, 0x80], np.uint8))
    q[1, :128] = rng.choice(SUBNORMAL, size=128)
    q[5, 128:] = rng.choice(np.concatenate([SUBNORMAL, [0, 0x80]]).astype(np.uint8), size=K - 128)
    q[9] = q[9] & 0x80  # a row of signed zeros
    scales = rng.uniform(0.5, 2.0, size=(N, K // 128)).astype(np.float32)
    return fp8_rows(q, scales), q, scales


@pytest.mark.parametrize("M", [1, 3, 5, 9])
def test_gemv_adds_subnormals_exactly(M):
    rng = np.random.default_rng(M)
    N, K = 19, 384
    raw, q, scales = _rows(rng, N, K)
    lin = QuantLinear.from_raw(RamlmType.FP8_E4M3, raw, (N, K))
    deq = e4m3_to_f32(q).astype(np.float64) * np.repeat(scales, 128, axis=1)
    np.testing.assert_array_equal(lin.dequantize(), deq.astype(np.float32))
    x = rng.standard_normal((M, K)).astype(np.float32)
    got = lin.matmul(x).astype(np.float64)
    ref = x.astype(np.float64) @ deq.T
    mag = np.abs(x).astype(np.float64) @ np.abs(deq).T  # the sums' own scale: a subnormal-only row is ~1e-3 of others
    assert (np.abs(got - ref) <= 1e-5 * mag + 1e-30).all()
    assert (got[:, 9] == 0).all()
    for m in range(M):  # each row as it gives alone
        np.testing.assert_array_equal(lin.matmul(x[m:m + 1])[0], got[m].astype(np.float32))
