"""The gated delta rule of one value head over a run of tokens, on its recurrent state S (dk, dv) float32:

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T        o_t = S_t^T q_t

token by token (decode, short chunks), or in the chunked form of long prefill chunks (chunks of CHUNK tokens: a
triangular solve turns the chunk's updates into matrix products, so S is read once per chunk instead of once per
token; transformers' torch_chunk_gated_delta_rule). Both give the same values to float32 rounding. q and k come
L2-normalised (q also scaled by dk^-0.5) by cpu_kernels/delta_net.py, which runs these per (sequence, head).
"""
from __future__ import annotations

import numpy as np
from numba import njit

CHUNK = 64  # tokens per chunk of the chunked form (transformers' chunk_size)
_TILE = 8   # rows updated together while one row of S is read (keeps S's traffic per chunk low)
_F0 = np.float32(0.0)


@njit(cache=True, error_model="numpy")
def token_step(S, q, k, v, beta, decay, o, kv):
    """One token: S (dk, dv) updated in place, o (dv,) = S^T q after the update. kv (dv,) is scratch.

    Computes kv = decay * S^T k, d = beta (v - kv), S = decay S + k d^T, o = S^T q (rows of S in order)."""
    dk = S.shape[0]
    for j in range(kv.shape[0]):
        kv[j] = _F0
    for i in range(dk):
        row, ki = S[i], k[i]
        for j in range(row.shape[0]):
            kv[j] += row[j] * ki
    for j in range(kv.shape[0]):
        kv[j] = beta * (v[j] - decay * kv[j])  # now d
        o[j] = _F0
    for i in range(dk):
        row, ki, qi = S[i], k[i], q[i]
        for j in range(row.shape[0]):
            s = row[j] * decay + ki * kv[j]
            row[j] = s
            o[j] += s * qi


@njit(cache=True, error_model="numpy", fastmath={"reassoc"})  # reassoc: the dot products over dk vectorize
def chunk_step(S, Q, K, V, beta, g, O, A, U, W):
    """m = Q.shape[0] tokens (m <= CHUNK) in the chunked form: S (dk, dv) updated in place, O (m, dv) the outputs.

    Q, K f32 (m, dk) (normalised), V (m, dv), beta, g (m,) (g: log decay <= 0). A (CHUNK, CHUNK), U (CHUNK, dv),
    W (CHUNK, dk) are scratch. With gamma = cumsum(g) and L[i, j] = beta_i (k_i . k_j) e^(gamma_i - gamma_j), j < i:
    U = (I + L)^-1 (beta V), W = (I + L)^-1 (beta e^gamma K); Vn = U - W S;
    O = e^gamma (Q S) + [(Q K^T) e^(gamma_i - gamma_j), j <= i] Vn; S = e^gamma_m S + (e^(gamma_m - gamma) K)^T Vn.
    """
    m, dk = Q.shape
    dv = V.shape[1]
    gam = np.empty(m, np.float32)
    acc = _F0
    for i in range(m):
        acc += g[i]
        gam[i] = acc
    eg = np.exp(gam)
    # L (strictly lower) and the two triangular solves by forward substitution
    for i in range(m):
        ki = K[i]
        for j in range(i):
            kj = K[j]
            d = _F0
            for p in range(dk):
                d += ki[p] * kj[p]
            A[i, j] = beta[i] * d * np.exp(gam[i] - gam[j])
        ur, wr, vi = U[i], W[i], V[i]
        bi, be = beta[i], beta[i] * eg[i]
        for c in range(dv):
            ur[c] = bi * vi[c]
        for p in range(dk):
            wr[p] = be * ki[p]
        for j in range(i):
            a = A[i, j]
            uj, wj = U[j], W[j]
            for c in range(dv):
                ur[c] -= a * uj[c]
            for p in range(dk):
                wr[p] -= a * wj[p]
    # Vn = U - W S (into U) and O = e^gamma Q S, a tile of rows per pass over S
    for i0 in range(0, m, _TILE):
        i1 = min(m, i0 + _TILE)
        for i in range(i0, i1):
            orow = O[i]
            for c in range(dv):
                orow[c] = _F0
        for p in range(dk):
            srow = S[p]
            for i in range(i0, i1):
                w, qe = W[i, p], Q[i, p] * eg[i]
                ur, orow = U[i], O[i]
                for c in range(dv):
                    ur[c] -= w * srow[c]
                    orow[c] += qe * srow[c]
    # O += the chunk's own causal part
    for i in range(m):
        qi, orow = Q[i], O[i]
        for j in range(i + 1):
            kj = K[j]
            d = _F0
            for p in range(dk):
                d += qi[p] * kj[p]
            a = d * np.exp(gam[i] - gam[j])
            uj = U[j]
            for c in range(dv):
                orow[c] += a * uj[c]
    # S = e^gamma_m S + sum_i e^(gamma_m - gamma_i) k_i Vn_i^T, a tile of S's rows per pass over Vn
    last = gam[m - 1]
    el, kd = eg[m - 1], np.empty(m, np.float32)
    for i in range(m):
        kd[i] = np.exp(last - gam[i])
    for p0 in range(0, dk, _TILE):
        p1 = min(dk, p0 + _TILE)
        for p in range(p0, p1):
            srow = S[p]
            for c in range(dv):
                srow[c] *= el
        for i in range(m):
            ur = U[i]
            for p in range(p0, p1):
                f = K[i, p] * kd[i]
                srow = S[p]
                for c in range(dv):
                    srow[c] += f * ur[c]
