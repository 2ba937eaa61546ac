"""apply_token_bitmask: the masked rows' refused tokens become -inf, the rest of the logits stay bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from cpu_kernels.token_mask import apply_token_bitmask


@pytest.mark.parametrize("V", [64, 1000, 262144])
def test_mask_matches_unpacked_bits(V):
    rng = np.random.default_rng(V)
    logits = rng.standard_normal((5, V)).astype(np.float32)
    before = logits.copy()
    rows = np.array([3, 0, 4])
    bitmask = rng.integers(-2**31, 2**31, (3, (V + 31) // 32), dtype=np.int64).astype(np.int32)
    bitmask[2] = 0  # a grammar that allows nothing
    allowed = apply_token_bitmask(logits, rows, bitmask)
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :V].astype(bool)
    want = before.copy()
    want[rows] = np.where(bits, before[rows], -np.inf)
    np.testing.assert_array_equal(logits, want)
    assert allowed.tolist() == [True, True, False]


def test_mask_needs_a_row_of_words_per_masked_row():
    with pytest.raises(ValueError, match="one bitmask row of ceil"):
        apply_token_bitmask(np.zeros((2, 40), np.float32), np.array([0]), np.zeros((1, 1), np.int32))
