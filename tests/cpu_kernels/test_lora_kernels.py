"""cpu_kernels/lora.py against numpy: each row's update from its own slot (none for -1, none where the slot's adapter
has rank 0 for this weight), ranks below the padded R, a column offset into a wider output; and a row's result the same
bits whatever the other rows are."""
from __future__ import annotations

import numpy as np

from cpu_kernels.lora import lora_add as _lora_add_parts, lora_embed_add


def lora_add(x, a, b, ranks, slots, order, y, col0):
    """One adapted weight (the kernel takes several that read the same x)."""
    _lora_add_parts(x, (a,), (b,), ranks[None], np.array([col0], np.int64), slots, order, y)


def _weights(rng, S=3, R=8, K=40, N=1100):
    a = rng.standard_normal((S, R, K)).astype(np.float32)
    b = rng.standard_normal((S, R, N)).astype(np.float32)
    ranks = np.array([8, 3, 0], np.int32)
    for s, r in enumerate(ranks):  # what the manager leaves past a slot's rank is never read: make it garbage
        a[s, r:] = np.nan
        b[s, r:] = np.nan
    return a, b, ranks


def _reference(x, a, b, ranks, slots, y, col0):
    out = y.copy()
    for t, s in enumerate(slots):
        if s >= 0 and ranks[s]:
            r = ranks[s]
            out[t, col0:col0 + b.shape[2]] += (a[s, :r].astype(np.float64) @ x[t]) @ b[s, :r]
    return out


def test_lora_add_matches_numpy():
    rng = np.random.default_rng(0)
    a, b, ranks = _weights(rng)
    x = rng.standard_normal((7, 40)).astype(np.float32)
    slots = np.array([0, -1, 1, 2, 0, 1, -1], np.int32)
    y = rng.standard_normal((7, 1200)).astype(np.float32)
    want = _reference(x, a, b, ranks, slots, y, 50)
    lora_add(x, a, b, ranks, slots, np.argsort(slots, kind="stable"), y, 50)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_a_row_does_not_depend_on_the_batch():
    rng = np.random.default_rng(1)
    a, b, ranks = _weights(rng)
    x = rng.standard_normal((9, 40)).astype(np.float32)
    slots = np.array([1, 0, -1, 0, 1, 1, 0, -1, 0], np.int32)
    y = np.zeros((9, 1100), np.float32)
    lora_add(x, a, b, ranks, slots, np.argsort(slots, kind="stable"), y, 0)
    for t in (0, 3, 8):
        alone = np.zeros((1, 1100), np.float32)
        lora_add(x[t:t + 1], a, b, ranks, slots[t:t + 1], np.zeros(1, np.int64), alone, 0)
        np.testing.assert_array_equal(alone[0], y[t])


def test_parts_into_their_columns_equal_one_at_a_time():
    """q|k|v-like parts of different widths in one call: each into its own columns, the bits of separate calls."""
    rng = np.random.default_rng(4)
    parts = [_weights(rng, N=n) for n in (64, 16, 16)]
    parts = [(np.nan_to_num(a), np.nan_to_num(b), r) for a, b, r in parts]
    x = rng.standard_normal((6, 40)).astype(np.float32)
    slots = np.array([0, 1, -1, 2, 1, 0], np.int32)
    order = np.argsort(slots, kind="stable")
    cols = np.array([0, 64, 80], np.int64)
    y = np.zeros((6, 96), np.float32)
    _lora_add_parts(x, tuple(p[0] for p in parts), tuple(p[1] for p in parts), np.stack([p[2] for p in parts]),
                    cols, slots, order, y)
    want = np.zeros((6, 96), np.float32)
    for (a, b, r), c in zip(parts, cols):
        lora_add(x, a, b, r, slots, order, want, int(c))
    np.testing.assert_array_equal(y, want)


def test_embedding_update_matches_numpy():
    rng = np.random.default_rng(2)
    V, H, R = 50, 24, 4
    a = rng.standard_normal((2, V, R)).astype(np.float32)
    b = rng.standard_normal((2, R, H)).astype(np.float32)
    ranks = np.array([4, 2], np.int32)
    ids = np.array([3, 49, 0, 7], np.int64)
    slots = np.array([0, 1, -1, 1], np.int32)
    x = rng.standard_normal((4, H)).astype(np.float32)
    want = x.copy()
    for t, s in enumerate(slots):
        if s >= 0:
            want[t] += a[s, ids[t], :ranks[s]] @ b[s, :ranks[s]]
    lora_embed_add(ids, a, b, ranks, slots, x)
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)


def test_bfloat16_weights_are_their_float32_values():
    """Slots stored as bfloat16 bits give the update of those bits' float32 values (lora_dtype bfloat16)."""
    from engine.lora.slots import to_bf16
    rng = np.random.default_rng(3)
    a, b, ranks = _weights(rng)
    a, b = np.nan_to_num(a), np.nan_to_num(b)
    a16, b16 = to_bf16(a), to_bf16(b)
    widen = lambda h: (h.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    assert np.abs(widen(a16) - a).max() <= np.abs(a).max() * 2 ** -8  # rounded to 8 bits of mantissa
    x = rng.standard_normal((5, 40)).astype(np.float32)
    slots = np.array([2, 0, 1, -1, 0], np.int32)
    y, want = np.zeros((5, 1100), np.float32), np.zeros((5, 1100), np.float32)
    lora_add(x, a16, b16, ranks, slots, np.argsort(slots, kind="stable"), y, 0)
    lora_add(x, widen(a16), widen(b16), ranks, slots, np.argsort(slots, kind="stable"), want, 0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)
