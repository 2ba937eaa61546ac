"""Mixture-of-experts routing and combining, shared by the kernel-by-kernel MoE (engine/model/parts/moe.py) and
the fused decode step (decode_block.py), so that both choose the same experts with the same weights and add their
outputs in the same order (the bits of one are the bits of the other)."""
from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.norms import _rms_row

# How router logits become expert scores.
SOFTMAX = 0       # softmax over all experts (qwen3moe, qwen3.5)
SIGMOID = 1       # independent sigmoids (deepseek-v3, glm-4.5)
TOPK_SOFTMAX = 2  # choose on the raw logits, then softmax over the chosen ones (gpt-oss)
SCORINGS = {"softmax": SOFTMAX, "sigmoid": SIGMOID, "topk_softmax": TOPK_SOFTMAX}


@njit(cache=True, error_model="numpy")
def _best(sel, allowed, taken):
    """The highest allowed, untaken score's index (ties to the lower id, as torch.topk), or -1."""
    best = -1
    for e in range(sel.shape[0]):
        if allowed[e] and not taken[e] and (best < 0 or sel[e] > sel[best]):
            best = e
    return best


@njit(cache=True, error_model="numpy")
def _allow_groups(sel, n_group, topk_group, allowed):
    """DeepSeek's group-limited choice: groups of E / n_group consecutive experts scored by their two best
    scores; only the topk_group best groups stay allowed."""
    E = sel.shape[0]
    size = E // n_group
    score = np.empty(n_group, np.float32)
    for g in range(n_group):
        a, b = -np.inf, -np.inf
        for e in range(g * size, (g + 1) * size):
            v = sel[e]
            if v > a:
                a, b = v, a
            elif v > b:
                b = v
        score[g] = a + b
    keep = np.zeros(n_group, np.bool_)
    for _ in range(topk_group):
        best = -1
        for g in range(n_group):
            if not keep[g] and (best < 0 or score[g] > score[best]):
                best = g
        keep[best] = True
    for e in range(E):
        allowed[e] = keep[e // size]


@njit(cache=True, error_model="numpy")
def expert_rows(logits, selection_bias, top_k, scoring, n_group, topk_group, norm_topk_prob, scale):
    """Router logits -> the top_k experts of each row and their weights.

    Args:
        logits: f32 (T, E). selection_bias: f32 (E,) added to the scores for the choice only ((0,): none).
        scoring: SOFTMAX, SIGMOID or TOPK_SOFTMAX. n_group, topk_group: group-limited choice (1, 1: none).
        norm_topk_prob: renormalize the chosen weights to sum 1. scale: multiplies the weights (routed scaling).
    Returns:
        ids int64 (T, top_k) in ascending expert order (the order outputs are added in), weights f32 (T, top_k).
    """
    T, E = logits.shape
    ids = np.empty((T, top_k), np.int64)
    weights = np.empty((T, top_k), np.float32)
    p = np.empty(E, np.float32)
    sel = np.empty(E, np.float32)
    taken = np.zeros(E, np.bool_)
    allowed = np.ones(E, np.bool_)
    for t in range(T):
        if scoring == SOFTMAX:
            m = logits[t, 0]
            for e in range(1, E):
                m = max(m, logits[t, e])
            s = np.float32(0.0)
            for e in range(E):
                p[e] = np.exp(logits[t, e] - m)
                s += p[e]
            for e in range(E):
                p[e] = p[e] / s
        elif scoring == SIGMOID:
            for e in range(E):
                p[e] = np.float32(1.0) / (np.float32(1.0) + np.exp(-logits[t, e]))
        else:
            for e in range(E):
                p[e] = logits[t, e]
        for e in range(E):
            sel[e] = p[e] + selection_bias[e] if selection_bias.shape[0] else p[e]
        if n_group > 1:
            _allow_groups(sel, n_group, topk_group, allowed)
        taken[:] = False
        for _ in range(top_k):
            taken[_best(sel, allowed, taken)] = True
        j = 0
        for e in range(E):
            if taken[e]:
                ids[t, j] = e
                weights[t, j] = p[e]
                j += 1
        if scoring == TOPK_SOFTMAX:  # softmax over the chosen logits
            m = weights[t, 0]
            for j in range(1, top_k):
                m = max(m, weights[t, j])
            s = np.float32(0.0)
            for j in range(top_k):
                weights[t, j] = np.exp(weights[t, j] - m)
                s += weights[t, j]
            for j in range(top_k):
                weights[t, j] /= s
        if norm_topk_prob:
            total = np.float32(0.0)
            for j in range(top_k):
                total += weights[t, j]
            if total > 0:
                for j in range(top_k):
                    weights[t, j] /= total
        if scale != 1.0:
            for j in range(top_k):
                weights[t, j] *= np.float32(scale)
    return ids, weights


@njit(cache=True, error_model="numpy")
def moe_accumulate(out_row, weight, y_row):
    """out_row += weight * y_row, in numpy's order (the product rounded, then the sum)."""
    for i in range(out_row.shape[0]):
        out_row[i] += weight * y_row[i]


@njit(cache=True, error_model="numpy")
def add_shared(out, shared, gate_w, x):
    """out += g * shared row by row, g = sigmoid(x . gate_w) (the shared expert's gate) or 1 ((0,) gate_w)."""
    for t in range(out.shape[0]):
        g = np.float32(1.0)
        if gate_w.shape[0]:
            d = 0.0
            for i in range(x.shape[1]):
                d += np.float64(x[t, i]) * np.float64(gate_w[i])
            g = np.float32(1.0) / (np.float32(1.0) + np.exp(-np.float32(d)))
        for i in range(out.shape[1]):
            out[t, i] += g * shared[t, i]


@njit(cache=True, error_model="numpy")
def router_input(x, scale, eps, root):
    """What a router reads when it normalizes its own input (Gemma 4): RMSNorm(x) without a weight, times scale (H,),
    times root (H^-0.5), in HF's order. x f32 (T, H) -> new f32 (T, H)."""
    T, H = x.shape
    out = np.empty((T, H), np.float32)
    ones = np.ones(H, np.float32)  # a weight of 1: x * r * 1 is x * r, bit for bit
    e32, r32 = np.float32(eps), np.float32(root)
    for t in range(T):
        _rms_row(x[t], ones, e32, out[t])
        for i in range(H):
            out[t, i] = (out[t, i] * scale[i]) * r32
    return out


@njit(cache=True, error_model="numpy")
def scale_chosen(ids, weights, expert_scale):
    """weights[t, j] *= expert_scale[ids[t, j]] in place (Gemma 4's per-expert output scale); (0,): nothing."""
    if expert_scale.shape[0]:
        for t in range(ids.shape[0]):
            for j in range(ids.shape[1]):
                weights[t, j] *= expert_scale[ids[t, j]]
