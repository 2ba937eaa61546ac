"""Mixture-of-experts routing and combining, shared by the kernel-by-kernel MoE (engine/model/parts/moe.py) and
the fused decode step (decode_block.py), so that both choose the same experts with the same weights and add their
outputs in the same order (the bits of one are the bits of the other)."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy")
def expert_rows(logits, top_k, norm_topk_prob):
    """Softmax router -> the top_k experts of each row, as torch.topk picks them (ties to the lower id).

    Args:
        logits: f32 (T, E) router outputs. top_k: experts per row. norm_topk_prob: renormalize the chosen weights.
    Returns:
        ids int64 (T, top_k) in ascending expert order (the order outputs are added in), weights f32 (T, top_k).
    """
    T, E = logits.shape
    ids = np.empty((T, top_k), np.int64)
    weights = np.empty((T, top_k), np.float32)
    p = np.empty(E, np.float32)
    taken = np.zeros(E, np.bool_)
    for t in range(T):
        m = logits[t, 0]
        for e in range(1, E):
            m = max(m, logits[t, e])
        s = np.float32(0.0)
        for e in range(E):
            p[e] = np.exp(logits[t, e] - m)
            s += p[e]
        taken[:] = False
        for j in range(top_k):
            best = -1
            for e in range(E):
                if not taken[e] and (best < 0 or p[e] > p[best]):
                    best = e
            taken[best] = True
        j = 0
        total = np.float32(0.0)
        for e in range(E):
            if taken[e]:
                ids[t, j] = e
                weights[t, j] = p[e] / s
                total += weights[t, j]
                j += 1
        if norm_topk_prob:
            for j in range(top_k):
                weights[t, j] /= total
    return ids, weights


@njit(cache=True, error_model="numpy")
def moe_accumulate(out_row, weight, y_row):
    """out_row += weight * y_row, in numpy's order (the product rounded, then the sum)."""
    for i in range(out_row.shape[0]):
        out_row[i] += weight * y_row[i]
