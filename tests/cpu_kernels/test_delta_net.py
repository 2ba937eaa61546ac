"""cpu_kernels/delta_net.py and delta_rule.py: the Gated DeltaNet core against a float64 numpy reference, the chunked
form against the token-by-token one, and the states carried across steps (odd chunk sizes, snapshots, restores)."""
from __future__ import annotations

import numpy as np
import pytest

from cpu_kernels.attn_inputs import sigmoid_gate
from cpu_kernels.delta_net import gdn_core

Hk, Hv, DK, DV, K = 2, 4, 16, 8, 4
C = 2 * Hk * DK + Hv * DV
EPS = 1e-6


def layer(seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    return dict(conv_w=f(K, C, scale=0.5), a_neg=-np.exp(f(Hv, scale=0.7)), dt_bias=f(Hv), norm_w=1 + f(DV, scale=0.1))


def inputs(T, seed=1):
    rng = np.random.default_rng(seed)
    y = rng.standard_normal((T, C + Hv * DV + 2 * Hv)).astype(np.float32)  # q|k|v, z, b, a stacked in one output
    return y


def pools(slots=4, seed=2):
    rng = np.random.default_rng(seed)  # garbage: a sequence at position 0 must not read it
    return (rng.standard_normal((slots, K - 1, C)).astype(np.float32),
            rng.standard_normal((slots, Hv, DK, DV)).astype(np.float32))


def run(y, w, conv_pool, ssm_pool, lens, starts, slots, snaps=None, chunk_min=64, par=False):
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    pos = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens)]).astype(np.int64)
    snaps = snaps or [(0, 0)] * len(lens)
    return gdn_core((y, 0), (y, C), (y, C + Hv * DV), (y, C + Hv * DV + Hv), w["conv_w"], w["a_neg"], w["dt_bias"],
                    w["norm_w"], EPS, conv_pool, ssm_pool, qsl, pos, np.asarray(slots, np.int32),
                    np.asarray([r for r, _ in snaps], np.int32), np.asarray([s for _, s in snaps], np.int32),
                    Hk, DK, DV, chunk_min, par)


def reference(y, w, hist=None, S=None):
    """float64 numpy of one sequence from (hist, S) (zeros: a fresh one): transformers' math, value head h on key
    head h % Hk. Returns (out (T, Hv DV), final hist, final S)."""
    y = y.astype(np.float64)
    T = y.shape[0]
    hist = np.zeros((K - 1, C)) if hist is None else hist.astype(np.float64)
    S = np.zeros((Hv, DK, DV)) if S is None else S.astype(np.float64).copy()
    x = np.concatenate([hist, y[:, :C]])
    conv = sum(w["conv_w"][j].astype(np.float64) * x[j:j + T] for j in range(K))
    conv = conv / (1 + np.exp(-conv))
    z = y[:, C:C + Hv * DV].reshape(T, Hv, DV)
    beta = 1 / (1 + np.exp(-y[:, C + Hv * DV:C + Hv * DV + Hv]))
    a = y[:, C + Hv * DV + Hv:] + w["dt_bias"]
    g = w["a_neg"] * np.log1p(np.exp(a))
    unit = lambda v: v / np.sqrt((v * v).sum(-1, keepdims=True) + 1e-6)  # noqa: E731
    q = unit(conv[:, :Hk * DK].reshape(T, Hk, DK)) / np.sqrt(DK)
    k = unit(conv[:, Hk * DK:2 * Hk * DK].reshape(T, Hk, DK))
    v = conv[:, 2 * Hk * DK:].reshape(T, Hv, DV)
    out = np.zeros((T, Hv, DV))
    for t in range(T):
        for h in range(Hv):
            kh, qh = k[t, h % Hk], q[t, h % Hk]
            S[h] *= np.exp(g[t, h])
            d = beta[t, h] * (v[t, h] - S[h].T @ kh)
            S[h] += np.outer(kh, d)
            out[t, h] = S[h].T @ qh
    o = out / np.sqrt((out * out).mean(-1, keepdims=True) + EPS) * w["norm_w"] * (z / (1 + np.exp(-z)))
    return o.reshape(T, Hv * DV), x[T:], S


@pytest.mark.parametrize("par", [False, True])
@pytest.mark.parametrize("chunk_min", [0, 8])
def test_batch_against_numpy_reference(par, chunk_min):
    w, lens = layer(), [5, 70, 1]
    y = inputs(sum(lens))
    conv_pool, ssm_pool = pools()
    out = run(y, w, conv_pool, ssm_pool, lens, [0, 0, 0], [3, 1, 2], chunk_min=chunk_min, par=par)
    t = 0
    for n, slot in zip(lens, [3, 1, 2]):
        ref, hist, S = reference(y[t:t + n], w)
        np.testing.assert_allclose(out[t:t + n], ref, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(conv_pool[slot], hist, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ssm_pool[slot], S, rtol=2e-4, atol=2e-5)
        t += n


def test_chunked_form_equals_token_by_token():
    w, n = layer(3), 200  # three full chunks and a partial one
    y = inputs(n, 4)
    outs, states = [], []
    for chunk_min in (0, 64):
        conv_pool, ssm_pool = pools()
        outs.append(run(y, w, conv_pool, ssm_pool, [n], [0], [1], chunk_min=chunk_min))
        states.append(ssm_pool[1].copy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(states[1], states[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("chunk_min", [0, 64])
def test_states_carry_across_odd_chunks(chunk_min):
    """A sequence fed as 7 + 66 + 1 + 1 + 30 rows over five calls equals it fed whole (the conv state crosses each
    boundary); token by token the bits are the same."""
    w, n = layer(5), 105
    y = inputs(n, 6)
    conv_pool, ssm_pool = pools()
    whole = run(y, w, conv_pool, ssm_pool, [n], [0], [2], chunk_min=chunk_min)
    conv_pool, ssm_pool = pools(seed=9)
    parts, t = [], 0
    for m in (7, 66, 1, 1, 30):
        parts.append(run(y[t:t + m], w, conv_pool, ssm_pool, [m], [t], [2], chunk_min=chunk_min))
        t += m
    got = np.concatenate(parts)
    if chunk_min == 0:
        np.testing.assert_array_equal(got, whole)
    else:
        np.testing.assert_allclose(got, whole, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("chunk_min", [0, 64])
def test_snapshot_is_the_state_at_its_row_and_restores(chunk_min):
    """The snapshot after 80 of 100 rows equals the states of a run of those 80 rows; copied into another slot and
    continued with the last 20, it gives the whole run's outputs."""
    w, n, r = layer(7), 100, 80
    y = inputs(n, 8)
    conv_pool, ssm_pool = pools()
    whole = run(y, w, conv_pool, ssm_pool, [n], [0], [1], snaps=[(r, 3)], chunk_min=chunk_min)
    c2, s2 = pools()
    run(y[:r], w, c2, s2, [r], [0], [1], chunk_min=chunk_min)
    np.testing.assert_array_equal(conv_pool[3], c2[1])
    np.testing.assert_allclose(ssm_pool[3], s2[1], rtol=1e-5, atol=1e-6)
    conv_pool[2], ssm_pool[2] = conv_pool[3], ssm_pool[3]  # a prefix-cache hit: the checkpoint into a live slot
    rest = run(y[r:], w, conv_pool, ssm_pool, [n - r], [r], [2], chunk_min=chunk_min)
    np.testing.assert_allclose(rest, whole[r:], rtol=1e-4, atol=2e-5)
    if chunk_min == 0:
        np.testing.assert_array_equal(rest, whole[r:])


def test_mismatched_shapes_are_refused():
    w = layer()
    conv_pool, ssm_pool = pools()
    with pytest.raises(ValueError):
        run(inputs(4)[:, :C], w, conv_pool, ssm_pool, [4], [0], [1])


def test_sigmoid_gate():
    rng = np.random.default_rng(0)
    T, H, D = 3, 2, 8
    y = rng.standard_normal((T, 5 + H * 2 * D)).astype(np.float32)
    out = rng.standard_normal((T, H, D)).astype(np.float32)
    want = out * (1 / (1 + np.exp(-y[:, 5:].reshape(T, H, 2, D)[:, :, 1])))
    sigmoid_gate(out, (y, 5 + D), 2 * D)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)
