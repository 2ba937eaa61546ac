"""A Gated DeltaNet layer (Qwen3.5's linear attention) between its input projections and out_proj, in one kernel:
the causal depthwise conv1d (+ SiLU) over q|k|v with its per-sequence conv state, L2-normalised q/k (q scaled),
beta = sigmoid(b), g = A * softplus(a + dt_bias), the gated delta rule on the per-sequence recurrent state
(delta_rule.py), and the gated RMSNorm with z. The kernel-by-kernel layer (engine/model/parts/delta_net.py) and the
fused decode step (decode_block.py) both run _gdn_core, so they give the same bits.

States live in per-layer pools indexed by a slot per sequence (engine/core/state_cache.py hands the slots out):
    conv_pool (num_slots, K - 1, C) f32: the last K - 1 inputs of the conv (C = 2 Hk dk + Hv dv channels)
    ssm_pool  (num_slots, Hv, dk, dv) f32: S per value head, rows over dk (transformers' layout; llama.cpp's
              ggml tensor holds S^T)
A sequence whose first row sits at position 0 starts from zero states (whatever its slot held). Value head h reads
key head h % Hk: GGUF's tiled order (llama.cpp's converter reorders HF's grouped heads; hf.py does it for HF folders).
A snapshot (snap_rows[s] = r > 0) copies both states after the sequence's first r rows of the step into slot
snap_slots[s]: the state at a block boundary that prefix caching restores later.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels.activations import exp_f32
from cpu_kernels.delta_rule import CHUNK, chunk_step, token_step
from cpu_kernels.norms import _rms_row, _sum_squares

CONV_BLOCK = 1024  # channels per conv work unit
L2_EPS = 1e-6      # transformers' l2norm eps (inside the rsqrt)
_F0 = np.float32(0.0)
_F1 = np.float32(1.0)


@njit(cache=True, error_model="numpy")
def _conv_unit(y, cq, w, conv_pool, qsl, positions, slots, snap_rows, snap_slots, out, s, c0, c1):
    """Channels c0:c1 of sequence s: out rows = silu(causal conv), then the snapshot and the new conv state."""
    t0, n = qsl[s], qsl[s + 1] - qsl[s]
    if n == 0:
        return
    Km1 = w.shape[0] - 1
    hist = conv_pool[slots[s]]
    fresh = positions[t0] == 0
    acc = np.empty(c1 - c0, np.float32)
    zeros = np.zeros(c1 - c0, np.float32)
    for t in range(n):
        for c in range(acc.shape[0]):
            acc[c] = _F0
        for j in range(Km1 + 1):
            u = t - Km1 + j  # input row, chunk coordinates; < 0 reads the state
            if u >= 0:
                src = y[t0 + u, cq + c0:cq + c1]
            elif fresh:
                src = zeros
            else:
                src = hist[Km1 + u, c0:c1]
            wr = w[j, c0:c1]
            for c in range(acc.shape[0]):
                acc[c] += wr[c] * src[c]
        orow = out[t0 + t, c0:c1]
        for c in range(acc.shape[0]):
            a = acc[c]
            orow[c] = a / (_F1 + exp_f32(-a))
    r = snap_rows[s]
    if 0 < r <= n:
        _conv_state(y, cq, hist, fresh, t0, r, conv_pool[snap_slots[s]], c0, c1)
    _conv_state(y, cq, hist, fresh, t0, n, hist, c0, c1)  # in place: rows shift towards 0, read before written


@njit(cache=True, error_model="numpy")
def _conv_state(y, cq, hist, fresh, t0, r, dst, c0, c1):
    """dst = the K - 1 conv inputs before chunk row r: rows r .. r + K - 2 of [hist; the chunk's inputs]."""
    Km1 = hist.shape[0]
    for i in range(Km1):
        q = r + i
        d = dst[i, c0:c1]
        if q >= Km1:
            src = y[t0 + q - Km1, cq + c0:cq + c1]
            for c in range(d.shape[0]):
                d[c] = src[c]
        elif fresh:
            for c in range(d.shape[0]):
                d[c] = _F0
        else:
            src = hist[q, c0:c1]
            for c in range(d.shape[0]):
                d[c] = src[c]


@njit(cache=True, error_model="numpy")
def _unit_vec(src, scale, dst):
    """dst = src / sqrt(|src|^2 + 1e-6) * scale (transformers' l2norm, then the query scaling)."""
    inv = _F1 / np.sqrt(np.float32(_sum_squares(src)) + np.float32(L2_EPS))
    for i in range(dst.shape[0]):
        dst[i] = (src[i] * inv) * scale


@njit(cache=True, error_model="numpy")
def _gates(yb, cb, ya, ca, t, h, a_neg, dt_bias):
    """(beta, g) of token row t, value head h: sigmoid(b) and A * softplus(a + dt_bias) (torch's threshold 20)."""
    beta = _F1 / (_F1 + np.exp(-yb[t, cb + h]))
    x = ya[t, ca + h] + dt_bias[h]
    sp = x if x > np.float32(20.0) else np.log1p(np.exp(x))
    return beta, a_neg[h] * sp


@njit(cache=True, error_model="numpy")
def _head_unit(conv_out, yz, cz, yb, cb, ya, ca, a_neg, dt_bias, norm_w, eps32, ssm_pool, qsl, positions, slots,
               snap_rows, snap_slots, Hk, dk, dv, chunk_min, out, s, h):
    """Value head h of sequence s: the delta rule over its rows (snapshot included), then the gated norm."""
    t0, n = qsl[s], qsl[s + 1] - qsl[s]
    if n == 0:
        return
    S = ssm_pool[slots[s], h]
    if positions[t0] == 0:
        for i in range(dk):
            row = S[i]
            for j in range(dv):
                row[j] = _F0
    kh = h % Hk
    qo, ko, vo = kh * dk, Hk * dk + kh * dk, 2 * Hk * dk + h * dv
    scale = np.float32(1.0 / np.sqrt(dk))
    r = snap_rows[s]
    cut = r if 0 < r < n else n  # rows before the snapshot, then the rest: chunks restart at the cut
    if chunk_min > 0 and n >= chunk_min:
        Q, K = np.empty((CHUNK, dk), np.float32), np.empty((CHUNK, dk), np.float32)
        V, O = np.empty((CHUNK, dv), np.float32), np.empty((CHUNK, dv), np.float32)
        A = np.zeros((CHUNK, CHUNK), np.float32)
        U, W = np.empty((CHUNK, dv), np.float32), np.empty((CHUNK, dk), np.float32)
        beta, g = np.empty(CHUNK, np.float32), np.empty(CHUNK, np.float32)
        for a, b in ((0, cut), (cut, n)):
            for c0 in range(a, b, CHUNK):
                m = min(b, c0 + CHUNK) - c0
                for i in range(m):
                    t = t0 + c0 + i
                    _unit_vec(conv_out[t, qo:qo + dk], scale, Q[i])
                    _unit_vec(conv_out[t, ko:ko + dk], _F1, K[i])
                    src, vr = conv_out[t, vo:vo + dv], V[i]
                    for j in range(dv):
                        vr[j] = src[j]
                    beta[i], g[i] = _gates(yb, cb, ya, ca, t, h, a_neg, dt_bias)
                chunk_step(S, Q[:m], K[:m], V[:m], beta[:m], g[:m], O[:m], A, U, W)
                for i in range(m):
                    orow, src = out[t0 + c0 + i, h * dv:(h + 1) * dv], O[i]
                    for j in range(dv):
                        orow[j] = src[j]
            if b == cut and 0 < r <= n:
                _copy_state(S, ssm_pool[snap_slots[s], h])
    else:
        buf = np.empty(2 * dk + dv, np.float32)  # one allocation per unit: decode runs Hv units per layer
        q, k, kv = buf[:dk], buf[dk:2 * dk], buf[2 * dk:]
        for i in range(n):
            t = t0 + i
            _unit_vec(conv_out[t, qo:qo + dk], scale, q)
            _unit_vec(conv_out[t, ko:ko + dk], _F1, k)
            beta, g = _gates(yb, cb, ya, ca, t, h, a_neg, dt_bias)
            token_step(S, q, k, conv_out[t, vo:vo + dv], beta, np.exp(g), out[t, h * dv:(h + 1) * dv], kv)
            if i + 1 == r:
                _copy_state(S, ssm_pool[snap_slots[s], h])
    for i in range(n):  # gated RMSNorm: norm(o) * w * silu(z), plain weight
        t = t0 + i
        orow, zr = out[t, h * dv:(h + 1) * dv], yz[t, cz + h * dv:cz + (h + 1) * dv]
        _rms_row(orow, norm_w, eps32, orow)
        for j in range(dv):
            z = zr[j]
            orow[j] *= z / (_F1 + exp_f32(-z))


@njit(cache=True, error_model="numpy")
def _copy_state(src, dst):
    for i in range(src.shape[0]):
        a, b = src[i], dst[i]
        for j in range(a.shape[0]):
            b[j] = a[j]


@njit(cache=True, error_model="numpy")
def _units_serial(y, cq, yz, cz, yb, cb, ya, ca, w, a_neg, dt_bias, norm_w, eps32, conv_pool, ssm_pool, qsl,
                  positions, slots, snap_rows, snap_slots, Hk, dk, dv, chunk_min, conv_out, out):
    S, C, Hv = qsl.shape[0] - 1, conv_out.shape[1], ssm_pool.shape[1]
    for s in range(S):
        for c0 in range(0, C, CONV_BLOCK):
            _conv_unit(y, cq, w, conv_pool, qsl, positions, slots, snap_rows, snap_slots, conv_out, s, c0,
                       min(C, c0 + CONV_BLOCK))
    for s in range(S):
        for h in range(Hv):
            _head_unit(conv_out, yz, cz, yb, cb, ya, ca, a_neg, dt_bias, norm_w, eps32, ssm_pool, qsl, positions,
                       slots, snap_rows, snap_slots, Hk, dk, dv, chunk_min, out, s, h)


@njit(cache=True, error_model="numpy", parallel=True)
def _units_par(y, cq, yz, cz, yb, cb, ya, ca, w, a_neg, dt_bias, norm_w, eps32, conv_pool, ssm_pool, qsl,
               positions, slots, snap_rows, snap_slots, Hk, dk, dv, chunk_min, conv_out, out):
    S, C, Hv = qsl.shape[0] - 1, conv_out.shape[1], ssm_pool.shape[1]
    nb = (C + CONV_BLOCK - 1) // CONV_BLOCK
    for u in prange(S * nb):
        s, b = u // nb, u % nb
        _conv_unit(y, cq, w, conv_pool, qsl, positions, slots, snap_rows, snap_slots, conv_out, s, b * CONV_BLOCK,
                   min(C, (b + 1) * CONV_BLOCK))
    for u in prange(S * Hv):
        _head_unit(conv_out, yz, cz, yb, cb, ya, ca, a_neg, dt_bias, norm_w, eps32, ssm_pool, qsl, positions, slots,
                   snap_rows, snap_slots, Hk, dk, dv, chunk_min, out, u // Hv, u % Hv)


@njit(cache=True, error_model="numpy")
def _gdn_core(y, cq, yz, cz, yb, cb, ya, ca, w, a_neg, dt_bias, norm_w, eps, conv_pool, ssm_pool, qsl, positions,
              slots, snap_rows, snap_slots, Hk, dk, dv, chunk_min, par):
    T, Hv, C = y.shape[0], ssm_pool.shape[1], w.shape[1]
    if (cq + C > y.shape[1] or cz + Hv * dv > yz.shape[1] or cb + Hv > yb.shape[1] or ca + Hv > ya.shape[1]
            or yz.shape[0] != T or yb.shape[0] != T or ya.shape[0] != T or C != 2 * Hk * dk + Hv * dv
            or conv_pool.shape[1] != w.shape[0] - 1 or conv_pool.shape[2] != C or ssm_pool.shape[2] != dk
            or ssm_pool.shape[3] != dv or norm_w.shape[0] != dv or Hv % Hk or qsl[qsl.shape[0] - 1] != T
            or positions.shape[0] != T or slots.shape[0] != qsl.shape[0] - 1):
        raise ValueError("gdn_core: projections, weights, states or the batch layout do not match")
    conv_out = np.empty((T, C), np.float32)
    out = np.empty((T, Hv * dv), np.float32)
    eps32 = np.float32(eps)
    if par:
        _units_par(y, cq, yz, cz, yb, cb, ya, ca, w, a_neg, dt_bias, norm_w, eps32, conv_pool, ssm_pool, qsl,
                   positions, slots, snap_rows, snap_slots, Hk, dk, dv, chunk_min, conv_out, out)
    else:
        _units_serial(y, cq, yz, cz, yb, cb, ya, ca, w, a_neg, dt_bias, norm_w, eps32, conv_pool, ssm_pool, qsl,
                      positions, slots, snap_rows, snap_slots, Hk, dk, dv, chunk_min, conv_out, out)
    return out


def gdn_core(qkv_cols, z_cols, b_cols, a_cols, conv_w, a_neg, dt_bias, norm_w, eps, conv_pool, ssm_pool,
             query_start_loc, positions, state_slots, snap_rows, snap_slots, num_k_heads, k_head_dim, v_head_dim,
             chunk_min=CHUNK, par=False):
    """The Gated DeltaNet between its projections and out_proj, for a batch of sequences.

    Args:
        qkv_cols, z_cols, b_cols, a_cols: (y, first column) of the projections' outputs, f32 (T, *) C-contiguous:
            q|k|v (C = 2 Hk dk + Hv dv columns, v heads in GGUF's tiled order), z (Hv dv), b (Hv), a (Hv).
        conv_w: f32 (K, C) (the conv1d weight transposed). a_neg: f32 (Hv,) = -exp(A_log). dt_bias: f32 (Hv,).
        norm_w: f32 (dv,) the gated norm's plain weight; eps its epsilon.
        conv_pool, ssm_pool: the layer's state pools (module docstring), updated in place.
        query_start_loc int32 (S+1,), positions int64 (T,): the batch layout. state_slots int32 (S,): each sequence's
            slot (distinct). snap_rows, snap_slots int32 (S,): snapshot after that many rows into that slot (0: none).
        chunk_min: sequences with at least this many rows run the chunked form (0: never, batch invariant).
        par: run the units on the thread pool.
    Returns:
        f32 (T, Hv dv): gated-norm outputs, the input of out_proj.
    """
    return _gdn_core(qkv_cols[0], qkv_cols[1], z_cols[0], z_cols[1], b_cols[0], b_cols[1], a_cols[0], a_cols[1],
                     conv_w, a_neg, dt_bias, norm_w, float(eps), conv_pool, ssm_pool, query_start_loc, positions,
                     state_slots, snap_rows, snap_slots, int(num_k_heads), int(k_head_dim), int(v_head_dim),
                     int(chunk_min), bool(par))
