"""rms_norm, LayerNorm, RoPE, the gated activations, GELU and the bias add against transformers / torch, their
oracles."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from numba import njit

from cpu_kernels import activations, layer_norm, norms, rope
from cpu_kernels.rope import RopeScaling

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

RNG = np.random.default_rng(1234)


def _randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------- LayerNorm (BERT)
@pytest.mark.parametrize("T,H", [(1, 768), (3, 96), (40, 257)])
def test_layer_norm_and_its_residual_step_match_torch(T, H):
    x, y, w, b = _randn(T, H, scale=3.0) + 2.0, _randn(T, H), _randn(H), _randn(H)
    ln = lambda a: torch.nn.functional.layer_norm(torch.from_numpy(a), (H,), torch.from_numpy(w),  # noqa: E731
                                                  torch.from_numpy(b), 1e-12).numpy()
    np.testing.assert_allclose(layer_norm.layer_norm(x, w, b, 1e-12), ln(x), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(layer_norm.residual_layer_norm(x, y, w, b, 1e-12), ln(x + y), rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(layer_norm.residual_layer_norm(x[:1], y[:1], w, b, 1e-12),
                                  layer_norm.residual_layer_norm(x, y, w, b, 1e-12)[:1])  # a row alone: same bits


def test_gelu_matches_torch_and_bias_add_matches_numpy():
    x = _randn(70, 600, scale=3.0)
    x[0, :4] = [0.0, -10.0, 10.0, -4.5]
    ref = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    got = activations.gelu(x.copy())
    assert np.abs(got - ref).max() < 2e-6 * max(1.0, np.abs(ref).max())
    b = _randn(600)
    want = x + b
    np.testing.assert_array_equal(activations.add_bias(x.copy(), b), want)  # parallel rows
    np.testing.assert_array_equal(activations.add_bias(x[:2].copy(), b), want[:2])  # numpy's
    with pytest.raises(ValueError, match="C-contiguous"):
        activations.gelu(x[:, ::2])


# ---------------------------------------------------------------- rms_norm
@pytest.mark.parametrize("T,H", [(1, 640), (3, 96), (40, 257)])
def test_rms_norm_matches_hf(T, H):
    x, w = _randn(T, H, scale=3.0), _randn(H)
    hf = modeling_llama.LlamaRMSNorm(H, eps=1e-6)
    hf.weight.data = torch.from_numpy(w)
    ref = hf(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(norms.rms_norm(x, w, 1e-6), ref, rtol=2e-6, atol=1e-6)


def test_rms_norm_unit_offset_matches_gemma():
    x, w = _randn(5, 128), _randn(128, scale=0.1)
    hf = Gemma3RMSNorm(128, eps=1e-6)
    hf.weight.data = torch.from_numpy(w)
    ref = hf(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(norms.rms_norm(x, w, 1e-6, True), ref, rtol=2e-6, atol=1e-6)


def test_rms_norm_rows_independent_of_batch_and_strides():
    x, w = _randn(64, 200), _randn(200)
    full = norms.rms_norm(x, w, 1e-5)  # parallel path
    for t in (0, 17, 63):
        assert np.array_equal(norms.rms_norm(x[t:t + 1], w, 1e-5)[0], full[t])
    wide = _randn(64, 400)
    wide[:, 100:300] = x
    assert np.array_equal(norms.rms_norm(wide[:, 100:300], w, 1e-5), full)


@pytest.mark.parametrize("T", [1, 5, 40])
@pytest.mark.parametrize("post,nxt", [(True, True), (True, False), (False, True)])
def test_residual_rms_norm_is_the_parts_in_turn(T, post, nxt):
    # The fused residual step gives the bits of rms_norm, numpy's add and rms_norm called one by one.
    x, y, pw, nw = _randn(T, 96), _randn(T, 96), _randn(96), _randn(96)
    none = np.empty(0, np.float32)
    x2, h = norms.residual_rms_norm(x, y, pw if post else none, nw if nxt else none, 1e-6, 1e-5)
    want = x + (norms.rms_norm(y, pw, 1e-6) if post else y)
    assert np.array_equal(x2, want)
    assert np.array_equal(h, norms.rms_norm(want, nw, 1e-5)) if nxt else h.shape == (T, 0)
    with pytest.raises(ValueError, match="do not match"):
        norms.residual_rms_norm(x, y[:, :64], pw, nw, 1e-6, 1e-6)


def test_rms_norm_heads_is_per_head():
    x, w = _randn(3, 4, 64), _randn(64)
    out = norms.rms_norm_heads(x, w, 1e-6)
    assert out.shape == (3, 4, 64)
    assert np.array_equal(out.reshape(12, 64), norms.rms_norm(x.reshape(12, 64), w, 1e-6))


# ---------------------------------------------------------------- RoPE frequencies
def _hf_config(head_dim, rope_parameters):
    return transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                                    max_position_embeddings=32768, rope_parameters=rope_parameters)


ROPE_CASES = [
    ("default", 64, {"rope_type": "default", "rope_theta": 10000.0}, RopeScaling()),
    ("default", 256, {"rope_type": "default", "rope_theta": 1e6}, RopeScaling()),
    ("linear", 128, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5}, RopeScaling("linear", 2.5)),
    ("llama3", 128, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
     RopeScaling("llama3", 8.0, 8192, low_freq_factor=1.0, high_freq_factor=4.0)),
    ("llama3", 64, {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
     RopeScaling("llama3", 8.0, 64, low_freq_factor=1.0, high_freq_factor=4.0)),
    ("yarn", 128, {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                   "original_max_position_embeddings": 8192}, RopeScaling("yarn", 4.0, 8192)),
    ("yarn", 64, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0, "beta_fast": 16.0, "beta_slow": 2.0,
                  "original_max_position_embeddings": 2048},
     RopeScaling("yarn", 16.0, 2048, beta_fast=16.0, beta_slow=2.0)),
    # gpt-oss: the correction range unrounded (truncate False); rounding it moves 8.09..17.40 to 8..18
    ("yarn", 64, {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                  "truncate": False, "original_max_position_embeddings": 4096},
     RopeScaling("yarn", 32.0, 4096, truncate=False)),
]


def _hf_inv_freq(kind, head_dim, params):
    cfg = _hf_config(head_dim, params)
    if kind == "default":
        inv, att = modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        inv, att = ROPE_INIT_FUNCTIONS[kind](cfg)
    return inv.numpy(), float(att)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("kind,head_dim,params,scaling", ROPE_CASES, ids=[f"{c[0]}-{c[1]}" for c in ROPE_CASES])
def test_rope_inv_freq_matches_hf(kind, head_dim, params, scaling):
    ref, ref_scale = _hf_inv_freq(kind, head_dim, params)
    inv, mscale = rope.rope_inv_freq(head_dim, params["rope_theta"], scaling)
    assert inv.dtype == np.float32 and inv.shape == (head_dim // 2,)
    # torch's float32 pow may differ by an ulp from the correctly rounded one; nothing else may.
    np.testing.assert_allclose(inv, ref, rtol=4e-7, atol=0)
    assert mscale == pytest.approx(ref_scale, rel=1e-12)


def test_yarn_truncate_moves_the_ramp():
    """gpt-oss's unrounded correction range is not the rounded one (a reader dropping truncate=False would fail the
    case above by this much)."""
    exact, _ = rope.rope_inv_freq(64, 150000.0, RopeScaling("yarn", 32.0, 4096, truncate=False))
    rounded, _ = rope.rope_inv_freq(64, 150000.0, RopeScaling("yarn", 32.0, 4096))
    assert np.abs(exact / rounded - 1).max() > 0.05


def test_rope_inv_freq_attn_factor_multiplies():
    _, m = rope.rope_inv_freq(64, 1e4, RopeScaling("yarn", 4.0, 2048, attn_factor=0.5))
    assert m == pytest.approx(0.5 * (0.1 * math.log(4.0) + 1.0))
    with pytest.raises(ValueError):
        rope.rope_inv_freq(64, 1e4, RopeScaling("longrope", 4.0))
    with pytest.raises(ValueError):
        rope.rope_inv_freq(64, 1e4, RopeScaling("yarn", 4.0))  # no original_max_position


# ---------------------------------------------------------------- apply_rope
def _hf_rope(x, positions, inv_freq, attention_scaling):
    """x (T, H, D) -> HF's apply_rotary_pos_emb with the cos/sin of LlamaRotaryEmbedding.forward."""
    emb = modeling_llama.LlamaRotaryEmbedding.__new__(modeling_llama.LlamaRotaryEmbedding)
    torch.nn.Module.__init__(emb)
    emb.inv_freq = torch.from_numpy(inv_freq)
    emb.attention_scaling = attention_scaling
    emb.rope_type = "default"
    xt = torch.from_numpy(x).transpose(0, 1)[None]  # (1, H, T, D)
    cos, sin = emb(xt, torch.from_numpy(positions)[None])
    q, _ = modeling_llama.apply_rotary_pos_emb(xt, xt, cos, sin)
    return q[0].transpose(0, 1).numpy()


@pytest.mark.parametrize("T,H,D,scale", [(1, 4, 256, 1.0), (5, 3, 64, 1.0), (40, 2, 128, 1.2079441541679836)])
def test_apply_rope_neox_matches_hf(T, H, D, scale):
    x = _randn(T, H, D)
    positions = RNG.integers(0, 8192, T).astype(np.int64)
    inv_freq = _hf_inv_freq("default", D, {"rope_type": "default", "rope_theta": 10000.0})[0]
    ref = _hf_rope(x, positions, inv_freq, scale)
    out = x.copy()
    rope.apply_rope(out, positions, inv_freq, scale, True)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("T", [3, 40])  # 40: the parallel paths
@pytest.mark.parametrize("neox", [True, False])
def test_shared_cos_sin_table_rotates_as_apply_rope(T, neox):
    inv_freq, _ = rope.rope_inv_freq(64, 10000.0, RopeScaling())
    positions = np.arange(100, 100 + T, dtype=np.int64)
    x = _randn(T, 3, 64, scale=2.0)
    ref = x.copy()
    rope.apply_rope(ref, positions, inv_freq, 0.9, neox)
    cos, sin = rope.rope_cos_sin(positions, inv_freq, 0.9)
    assert cos.shape == (T, 32)
    got = x.copy()
    for lo, hi in ((0, 2), (2, 3)):  # q and k heads of one step share the table
        part = np.ascontiguousarray(got[:, lo:hi])
        rope.rotate(part, cos, sin, neox)
        got[:, lo:hi] = part
    assert np.array_equal(got, ref)
    with pytest.raises(ValueError):
        rope.rotate(x[:2].copy(), cos, sin, neox)


def test_apply_rope_normal_pairs_is_permuted_neox():
    T, H, D = 6, 2, 64
    x = _randn(T, H, D)
    positions = np.arange(100, 100 + T, dtype=np.int64)
    inv_freq, _ = rope.rope_inv_freq(D, 10000.0, RopeScaling())
    perm = np.concatenate([np.arange(0, D, 2), np.arange(1, D, 2)])  # (2i, 2i+1) -> (i, i + D/2)
    ref = _hf_rope(np.ascontiguousarray(x[:, :, perm]), positions, inv_freq, 1.0)
    out = x.copy()
    rope.apply_rope(out, positions, inv_freq, 1.0, False)
    np.testing.assert_allclose(out[:, :, perm], ref, rtol=1e-5, atol=2e-6)


def test_apply_rope_partial_rotary_leaves_the_rest():
    T, H, D, R = 3, 2, 64, 32
    x = _randn(T, H, D)
    positions = np.array([0, 7, 300], np.int64)
    inv_freq, _ = rope.rope_inv_freq(R, 10000.0, RopeScaling())
    out = x.copy()
    rope.apply_rope(out, positions, inv_freq, 1.0, True)
    np.testing.assert_allclose(out[:, :, :R], _hf_rope(np.ascontiguousarray(x[:, :, :R]), positions, inv_freq, 1.0),
                               rtol=1e-5, atol=2e-6)
    assert np.array_equal(out[:, :, R:], x[:, :, R:])
    assert np.array_equal(out[0], x[0])  # position 0 is the identity


# ---------------------------------------------------------------- activations
@njit(cache=True)
def _exp_array(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = activations.exp_f32(x[i])
    return out


def test_exp_f32_within_two_ulp():
    x = np.concatenate([np.linspace(-87.0, 88.0, 200001, dtype=np.float32), _randn(1000), np.float32([0, -0.0])])
    ref = np.exp(x.astype(np.float64))
    err_ulp = np.abs(_exp_array(x) - ref) / np.spacing(ref.astype(np.float32))
    assert err_ulp.max() <= 2.0


def _gate_up(T, F, scale):
    gu = _randn(T, 2 * F, scale=scale)
    gu[0, :8] = [0.0, -0.0, 100.0, -100.0, 1e-30, -20.0, 20.0, -9.5]
    return gu[:, :F], gu[:, F:]  # strided views, as from a fused gate/up matmul


@pytest.mark.parametrize("T,F", [(1, 2048), (3, 100), (20, 3000)])  # (20, 3000): the parallel path
def test_silu_mul_matches_torch(T, F):
    gate, up = _gate_up(T, F, 4.0)
    ref = (torch.nn.functional.silu(torch.from_numpy(gate.copy())) * torch.from_numpy(up.copy())).numpy()
    out = activations.silu_mul(gate, up)
    assert out.shape == (T, F) and out.flags.c_contiguous
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert np.array_equal(activations.silu_mul(np.ascontiguousarray(gate), np.ascontiguousarray(up)), out)


@pytest.mark.parametrize("T,F", [(1, 2048), (20, 3000)])
def test_gelu_tanh_mul_matches_torch(T, F):
    gate, up = _gate_up(T, F, 3.0)
    g = torch.from_numpy(gate.copy())
    ref = (torch.nn.functional.gelu(g, approximate="tanh") * torch.from_numpy(up.copy())).numpy()
    # torch's 1 + tanh(u) cancels for gate << 0, so part of the gap is torch's own rounding.
    np.testing.assert_allclose(activations.gelu_tanh_mul(gate, up), ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("T,F", [(1, 640), (20, 3000)])
def test_halves_read_the_stacked_output_as_the_pair(T, F):
    gate, up = _gate_up(T, F, 3.0)
    stacked = np.ascontiguousarray(gate.base)  # the (T, 2F) gate|up array the views come from: read in place
    assert np.array_equal(activations._gelu_tanh_mul(stacked, 0, stacked, F, F), activations.gelu_tanh_mul(gate, up))
    assert np.array_equal(activations._silu_mul(stacked, 0, stacked, F, F), activations.silu_mul(gate, up))


@pytest.mark.parametrize("shape", [(3, 1000), (2, 40000)])
def test_softcap_in_place_matches_torch(shape):
    x = _randn(*shape, scale=20.0)
    x[0, :6] = [0.0, 1e-4, -1e-4, 500.0, -500.0, 29.9]
    cap = 30.0
    ref = (torch.tanh(torch.from_numpy(x) / cap) * cap).numpy()
    y = x.copy()
    assert activations.softcap(y, cap) is y
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=2e-6)
