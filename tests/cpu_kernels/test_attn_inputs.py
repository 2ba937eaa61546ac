"""attn_inputs against rms_norm, rotate and write_kv called in turn: the same bits, any row count."""
from __future__ import annotations

import numpy as np
import pytest

from cpu_kernels import attention, norms, rope
from cpu_kernels.attn_inputs import attn_inputs
from cpu_kernels.rope import RopeScaling


def _parts_in_turn(y, hq, hkv, d, qn, kn, cos, sin, neox, kc, vc, slots):
    t, y = y.shape[0], y.copy()  # one row's slices are views, which rotate would change in place
    q = np.ascontiguousarray(y[:, :hq * d]).reshape(t, hq, d)
    k = np.ascontiguousarray(y[:, hq * d:(hq + hkv) * d]).reshape(t, hkv, d)
    v = np.ascontiguousarray(y[:, (hq + hkv) * d:]).reshape(t, hkv, d)
    if qn is not None:
        q = norms.rms_norm(q.reshape(-1, d), *qn).reshape(t, hq, d)
        k = norms.rms_norm(k.reshape(-1, d), *kn).reshape(t, hkv, d)
    rope.rotate(q, cos, sin, neox)
    rope.rotate(k, cos, sin, neox)
    attention.write_kv(k, v, kc, vc, slots)
    return q


@pytest.mark.parametrize("T", [1, 3, 20])
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("neox,rotary", [(True, 32), (False, 32), (True, 16)])
@pytest.mark.parametrize("cache_dtype", [np.float16, np.float32])
def test_attn_inputs_are_the_parts_in_turn(T, qk_norm, neox, rotary, cache_dtype):
    rng = np.random.default_rng(T)
    hq, hkv, d, bs = 4, 2, 32, 4
    y = rng.standard_normal((T, (hq + 2 * hkv) * d)).astype(np.float32)
    qn = (rng.standard_normal(d).astype(np.float32), 1e-6) if qk_norm else None
    kn = (rng.standard_normal(d).astype(np.float32), 1e-5) if qk_norm else None
    inv_freq, mscale = rope.rope_inv_freq(rotary, 10000.0, RopeScaling())
    cos, sin = rope.rope_cos_sin(np.arange(5, 5 + T, dtype=np.int64), inv_freq, mscale)
    slots = rng.permutation(8 * bs)[:T].astype(np.int64)
    slots[T // 2] = -1  # a padding row: q computed, nothing stored
    want_k, want_v = np.zeros((8, bs, hkv, d), cache_dtype), np.zeros((8, bs, hkv, d), cache_dtype)
    want_q = _parts_in_turn(y, hq, hkv, d, qn, kn, cos, sin, neox, want_k, want_v, slots)
    k_cache, v_cache = np.zeros_like(want_k), np.zeros_like(want_v)
    # The stacked q|k|v output serves all three parts, as Projections.columns hands it over.
    q = attn_inputs((y, 0), (y, hq * d), (y, (hq + hkv) * d), hq, qn, kn, cos, sin, neox, k_cache, v_cache, slots)
    assert q.shape == (T, hq, d)
    assert np.array_equal(q, want_q)
    assert np.array_equal(k_cache.view(np.uint8), want_k.view(np.uint8))
    assert np.array_equal(v_cache.view(np.uint8), want_v.view(np.uint8))
    # Parts in separate outputs (formats that do not stack) give the same.
    yq, yk, yv = (np.ascontiguousarray(a) for a in np.split(y, [hq * d, (hq + hkv) * d], axis=1))
    k2, v2 = np.zeros_like(want_k), np.zeros_like(want_v)
    q2 = attn_inputs((yq, 0), (yk, 0), (yv, 0), hq, qn, kn, cos, sin, neox, k2, v2, slots)
    assert np.array_equal(q2, want_q) and np.array_equal(k2, k_cache) and np.array_equal(v2, v_cache)


def test_attn_inputs_rejects_mismatches():
    y = np.ones((2, 8 * 16), np.float32)
    cos, sin = rope.rope_cos_sin(np.arange(2, dtype=np.int64), np.ones(8, np.float32), 1.0)
    kc = np.zeros((2, 4, 2, 16), np.float16)
    with pytest.raises(ValueError, match="do not match"):  # v's 2 heads run past the output's end
        attn_inputs((y, 0), (y, 64), (y, 112), 4, None, None, cos, sin, True, kc, kc.copy(), np.arange(2))
    with pytest.raises(ValueError, match="do not match"):  # a norm weight of the wrong length
        attn_inputs((y, 0), (y, 64), (y, 96), 4, (np.ones(8, np.float32), 1e-6), (np.ones(16, np.float32), 1e-6),
                    cos, sin, True, kc, kc.copy(), np.arange(2))
    with pytest.raises(ValueError, match="slot outside the cache"):
        attn_inputs((y, 0), (y, 64), (y, 96), 4, None, None, cos, sin, True, kc, kc.copy(), np.array([0, 8]))
