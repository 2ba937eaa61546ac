"""LoRA's low-rank updates for a batch whose rows use different adapters (vLLM's shrink and expand, fused): each row
t reads the adapter in slot slots[t] (-1: none) of stacked per-slot weights, zero-padded to the largest rank.

Every output element is summed in one fixed order whatever the batch holds, so a row's result does not depend on the
other rows (DESIGN.md's batch invariance). Scales are folded into B when an adapter is loaded.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from cpu_kernels.activations import bits_to_f32


def _value(v):
    """A weight as float32: float32 as it is, bfloat16 bits (uint16) widened."""


@overload(_value)
def _value_impl(v):
    if v == types.float32:
        return lambda v: v
    if v == types.uint16:
        return lambda v: bits_to_f32(np.uint32(v) << np.uint32(16))
    return None

@njit(cache=True, error_model="numpy", fastmath={"reassoc", "contract"}, parallel=True)
def lora_add(x, a, b, ranks, cols, slots, order, y):
    """y[t, cols[p]:cols[p] + N_p] += (A_p[s] @ x[t]) @ B_p[s] for every part p, s = slots[t] >= 0: the adapted
    weights that read the same x (q/k/v, gate/up stacked into one output) in one call.

    x (T, K) f32; a: P arrays (S, R, K), b: P arrays (S, R, N_p) (B transposed, scaled), float32 or bfloat16 bits
    (uint16); ranks (P, S) int32 (0: no update for that slot); cols (P,) int64 first output column of each part;
    slots (T,) int32; order (T,) int64 the rows sorted by slot; y (T, >= cols[p] + N_p) f32 C-contiguous, updated in
    place. One parallel unit per row, taken in `order`: a thread's share of the rows is whole adapters, so each
    adapter's A and B are read from memory once, by one thread.
    """
    T, K = x.shape
    R = a[0].shape[1]
    for i in prange(T):
        t = order[i]
        s = slots[t]
        if s < 0:
            continue
        h = np.empty(R, np.float32)
        for p in range(len(a)):
            r = ranks[p, s]
            ap, bp = a[p], b[p]
            for j in range(r):
                acc = np.float32(0.0)
                for k in range(K):
                    acc += _value(ap[s, j, k]) * x[t, k]
                h[j] = acc
            n_p = bp.shape[2]
            out = y[t, cols[p]:cols[p] + n_p]
            for j in range(r):
                hj = h[j]
                row = bp[s, j]
                for n in range(n_p):
                    out[n] += hj * _value(row[n])


@njit(cache=True, error_model="numpy", fastmath={"reassoc", "contract"}, parallel=True)
def lora_embed_add(ids, a, b, ranks, slots, x):
    """x[t] += A[s][ids[t]] @ B[s] for s = slots[t] >= 0 (an embedding's update: A's row of the token).

    ids (T,) int64, a (S, V, R), b (S, R, H) (scaled) float32 or bfloat16 bits, ranks (S,) int32, slots (T,) int32, x (T, H) f32.
    """
    T, H = x.shape
    for t in prange(T):
        s = slots[t]
        if s < 0:
            continue
        for j in range(ranks[s]):
            aj = _value(a[s, ids[t], j])
            for n in range(H):
                x[t, n] += aj * _value(b[s, j, n])


def warmup(dtype=np.float32) -> None:
    """Compiles (or loads) both kernels for the types the model passes (weights of `dtype`: float32 or uint16)."""
    x = np.ones((3, 8), np.float32)
    a, b = np.ones((2, 4, 8), dtype), np.ones((2, 4, 6), dtype)
    ranks, slots = np.array([4, 0], np.int32), np.array([0, -1, 1], np.int32)
    order = np.argsort(slots, kind="stable")
    for parts in (1, 2, 3):  # a Linear alone, gate|up, q|k|v
        lora_add(x, (a,) * parts, (b,) * parts, np.tile(ranks, (parts, 1)), np.arange(parts, dtype=np.int64) * 6,
                 slots, order, np.zeros((3, 6 * parts), np.float32))
    lora_embed_add(np.array([1, 2, 3], np.int64), np.ones((2, 8, 4), dtype), b, ranks, slots,
                   np.zeros((3, 6), np.float32))
