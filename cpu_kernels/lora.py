"""LoRA's low-rank updates for a batch whose rows use different adapters (vLLM's shrink and expand, fused): each row
t reads the adapter in slot slots[t] (-1: none) of stacked per-slot weights, zero-padded to the largest rank.

Every output element is summed in one fixed order whatever the batch holds, so a row's result does not depend on the
other rows (DESIGN.md's batch invariance). Scales are folded into B when an adapter is loaded.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_COLS = 512  # output columns per parallel unit of the expand


@njit(cache=True, error_model="numpy", fastmath={"reassoc", "contract"}, parallel=True)
def lora_add(x, a, b, ranks, slots, y, col0):
    """y[t, col0:col0 + N] += (A[s] @ x[t]) @ B[s] for s = slots[t] >= 0.

    x (T, K) f32, a (S, R, K) f32, b (S, R, N) f32 (B transposed, scaled), ranks (S,) int32 (0: the slot's adapter
    has no update here), slots (T,) int32, y (T, >= col0 + N) f32 C-contiguous, updated in place.
    """
    T, K = x.shape
    R, N = a.shape[1], b.shape[2]
    h = np.zeros((T, R), np.float32)
    for t in prange(T):
        s = slots[t]
        if s < 0:
            continue
        for j in range(ranks[s]):
            acc = np.float32(0.0)
            for k in range(K):
                acc += a[s, j, k] * x[t, k]
            h[t, j] = acc
    chunks = (N + _COLS - 1) // _COLS
    for unit in prange(T * chunks):
        t = unit // chunks
        s = slots[t]
        if s < 0:
            continue
        lo = (unit % chunks) * _COLS
        hi = min(N, lo + _COLS)
        out = y[t, col0 + lo:col0 + hi]
        for j in range(ranks[s]):
            hj = h[t, j]
            row = b[s, j, lo:hi]
            for n in range(hi - lo):
                out[n] += hj * row[n]


@njit(cache=True, error_model="numpy", fastmath={"reassoc", "contract"}, parallel=True)
def lora_embed_add(ids, a, b, ranks, slots, x):
    """x[t] += A[s][ids[t]] @ B[s] for s = slots[t] >= 0 (an embedding's update: A's row of the token).

    ids (T,) int64, a (S, V, R) f32, b (S, R, H) f32 (scaled), ranks (S,) int32, slots (T,) int32, x (T, H) f32.
    """
    T, H = x.shape
    for t in prange(T):
        s = slots[t]
        if s < 0:
            continue
        for j in range(ranks[s]):
            aj = a[s, ids[t], j]
            for n in range(H):
                x[t, n] += aj * b[s, j, n]


def warmup() -> None:
    """Compiles (or loads) both kernels for the types the model passes."""
    x = np.ones((3, 8), np.float32)
    a, b = np.ones((2, 4, 8), np.float32), np.ones((2, 4, 6), np.float32)
    ranks, slots = np.array([4, 0], np.int32), np.array([0, -1, 1], np.int32)
    lora_add(x, a, b, ranks, slots, np.zeros((3, 10), np.float32), 2)
    lora_embed_add(np.array([1, 2, 3], np.int64), np.ones((2, 8, 4), np.float32), b, ranks, slots,
                   np.zeros((3, 6), np.float32))
