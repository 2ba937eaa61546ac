"""The pieces of the 512-bit IQ2/IQ3 GEMV (k_grid_pairs.py) against the per-block code of k_grid.py and gguf's sign
table: sign masks in both lowerings, the super-block scale vectors, IQ3_S's gathered magnitudes. The whole GEMV is
covered with every format in test_quant.py."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from numba import literally, njit

from bench.make_synthetic import random_tensor
from cpu_kernels.quant import k_grid, k_grid_pairs as kp
from cpu_kernels.quant.grids import KSIGNS
from cpu_kernels.quant.simd import store

FIELDS = {"iq2_xxs": (32, 32, 7), "iq2_xs": (9, 9, 16), "iq3_xxs": (0, 32, 7)}
LOWERINGS = [False] + ([True] if kp.VECTOR_SIGNS else [])


def expected_mask(w0, w1, base0, base1, stride):
    m = 0
    for h, (w, base) in enumerate(((w0, base0), (w1, base1))):
        for f in range(4):
            m |= int(KSIGNS[(w >> (base + stride * f)) & 127]) << (32 * h + 8 * f)
    return m


@pytest.mark.parametrize("vector", LOWERINGS)
@pytest.mark.parametrize("layout", sorted(FIELDS))
def test_ksign_masks(layout, vector):
    mask = kp._make_ksign_mask(*FIELDS[layout], vector=vector)

    @njit
    def run(w0, w1, out):
        for i in range(w0.size):
            out[i] = mask(w0[i], w1[i])
    rng = np.random.default_rng(0)
    w0, w1 = (rng.integers(0, 2**64, 500, dtype=np.uint64) for _ in range(2))
    out = np.empty(500, np.uint64)
    run(w0, w1, out)
    assert [int(v) for v in out] == [expected_mask(int(a), int(b), *FIELDS[layout]) for a, b in zip(w0, w1)]


def _super_blocks(t, n=6):
    raw = random_tensor(np.random.default_rng(1), t, (n, 256), std=1.0)
    return np.ascontiguousarray(raw.reshape(-1))


@njit
def _scales_both(raw, fmt, ts, n, got, want):
    literally(fmt)  # super_scales16 picks its lowering by format
    sc = np.empty(16, np.float32)
    for i in range(n):
        store(got, 16 * i, kp.super_scales16(raw, i * ts, fmt, k_grid.half(raw, i * ts)))
        k_grid.super_scales(raw, i * ts, fmt, sc)
        want[16 * i:16 * i + 16] = sc


def _pair_mags_both(fmt):
    """A kernel writing the pairs' magnitudes (fmt fixed, as in the GEMVs) and k_grid's per-block ones."""
    @njit
    def run(raw, ts, n, got, want):
        vb = np.empty(64, np.uint8)
        for i in range(n):
            o = i * ts
            for j in range(0, 8, 2):
                store(got, 256 * i + 32 * j, kp.pair_mags(raw, o, fmt, j))
                store(vb, 0, k_grid.signed_block(raw, o, fmt, j)[0])
                store(vb, 32, k_grid.signed_block(raw, o, fmt, j + 1)[0])
                want[256 * i + 32 * j:256 * i + 32 * j + 64] = vb
    return run


@pytest.mark.parametrize("t", [Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S])
def test_super_scales16(t):
    fmt = getattr(k_grid, t.name)
    raw = _super_blocks(t)
    got, want = np.empty(96, np.float32), np.empty(96, np.float32)
    _scales_both(raw, fmt, k_grid.TYPE_SIZE[fmt], 6, got, want)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("t", [Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S])
def test_pair_mags(t):
    """The magnitudes a pair of blocks gets (table words read per point for IQ2_S and the IQ3 types) are k_grid's."""
    fmt = getattr(k_grid, t.name)
    raw = _super_blocks(t)
    got, want = np.empty(6 * 256, np.uint8), np.empty(6 * 256, np.uint8)
    _pair_mags_both(fmt)(raw, k_grid.TYPE_SIZE[fmt], 6, got, want)
    np.testing.assert_array_equal(got, want)
