"""gpu_kernels against cpu_kernels (and gguf's numpy oracle), on torch's CPU device and, when present, CUDA."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from cpu_kernels import activations, attention, norms, rope
from cpu_kernels.quant.qtypes import dequantize
from cpu_kernels.quant.quantize import UNWRITTEN, quantize
from cpu_kernels.quant.registry import FORMATS
from engine.core.kv_spec import LayerKV
from engine.model.config import RopeScaling
from engine.worker.runner import layer_cache
from gpu_kernels import attention as dattn
from gpu_kernels import ops
from gpu_kernels.dequant import DEQUANT, FLOAT_TYPES, dequantize_rows

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]
Q = gguf.GGMLQuantizationType


def t(a, dev):
    return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


def test_every_registered_format_has_a_device_dequantizer():
    from offload.sizes import DEVICE_PACKED_TYPES
    assert set(FORMATS) == set(DEQUANT) | set(FLOAT_TYPES)
    assert DEVICE_PACKED_TYPES == {q.name for q in FORMATS}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("qtype", sorted(DEQUANT, key=lambda q: q.name), ids=lambda q: q.name)
def test_dequant_is_bit_equal_to_gguf(qtype, dev):
    rng = np.random.default_rng(1)
    if qtype in UNWRITTEN:  # random blocks of the file layout (every bit pattern is a valid block)
        from bench.make_synthetic import random_tensor
        raw = random_tensor(rng, qtype, (6, 512), std=1.0)
    else:
        raw = quantize(qtype, rng.standard_normal((6, 512)).astype(np.float32))
    want = dequantize(raw, qtype)
    got = dequantize_rows(t(raw, dev), qtype, 512).cpu().numpy()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dev", DEVICES)
def test_rms_norm_matches(dev):
    x = np.random.default_rng(2).standard_normal((7, 96)).astype(np.float32) * 3
    w = np.random.default_rng(3).standard_normal(96).astype(np.float32)
    want = norms.rms_norm(x, w, 1e-6)
    got = ops.rms_norm(t(x, dev), t(w, dev), 1e-6).cpu().numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("scaling,rot", [(RopeScaling(), 64),
                                         (RopeScaling("yarn", 4.0, 128), 64),
                                         (RopeScaling("llama3", 8.0, 64), 32)])  # 32 of 64 dims: partial rotary
def test_rope_matches(dev, neox, scaling, rot):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 3, 64)).astype(np.float32)
    pos = np.array([0, 1, 2, 7, 100, 511, 1000, 3, 4], np.int64)
    inv_freq, mscale = rope.rope_inv_freq(rot, 10000.0, scaling)
    want = x.copy()
    rope.apply_rope(want, pos, inv_freq, mscale, neox)
    cos, sin = ops.rope_cos_sin(t(pos, dev), t(inv_freq, dev), mscale)
    got = ops.apply_rope(t(x, dev), cos, sin, neox).cpu().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("dev", DEVICES)
def test_activations_match(dev):
    rng = np.random.default_rng(5)
    g, u = (rng.standard_normal((4, 300)).astype(np.float32) * 4 for _ in range(2))
    np.testing.assert_allclose(ops.silu_mul(t(g, dev), t(u, dev)).cpu().numpy(), activations.silu_mul(g, u),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ops.gelu_tanh_mul(t(g, dev), t(u, dev)).cpu().numpy(),
                               activations.gelu_tanh_mul(g, u), rtol=1e-5, atol=1e-6)
    x = g * 20
    want = x.copy()
    activations.softcap(want, 30.0)
    np.testing.assert_allclose(ops.softcap(t(x, dev), 30.0).cpu().numpy(), want, rtol=1e-5, atol=1e-5)


KV_DTYPES = ["fp16", "fp32", "fp8", "fp8_e5m2", "int8"]


def written_cache(kv: str, rows: np.ndarray, NB: int, BS: int) -> np.ndarray:
    """A cache of kv_cache_dtype kv holding f32 rows (NB * BS, Hkv, D) at their flat slots, written by
    cpu_kernels (the bytes the device path must read as the CPU does)."""
    k, _ = layer_cache(LayerKV(rows.shape[1], rows.shape[2]), NB, BS, kv)
    attention.write_kv(rows, rows, k, k.copy(), np.arange(NB * BS, dtype=np.int64))
    return k


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("window,cap", [(0, 0.0), (5, 0.0), (0, 20.0)])
def test_paged_attention_matches(dev, kv, window, cap):
    """A mixed batch (a prefill chunk after cached tokens, a decode, a fresh prompt) over shuffled blocks,
    GQA 4:2; also cut into several groups by a tiny scratch budget; every KV storage, its bytes written by the CPU."""
    rng = np.random.default_rng(6)
    NB, BS, Hkv, Hq, D = 24, 4, 2, 4, 32
    q_lens, ctx = [5, 1, 7], [9, 13, 7]
    T = sum(q_lens)
    k_cache = written_cache(kv, (rng.standard_normal((NB * BS, Hkv, D)) * 0.5).astype(np.float32), NB, BS)
    v_cache = written_cache(kv, rng.standard_normal((NB * BS, Hkv, D)).astype(np.float32), NB, BS)
    perm = rng.permutation(np.arange(1, NB))
    tables = np.zeros((3, 4), np.int32)
    for s in range(3):
        tables[s] = perm[4 * s: 4 * s + 4]
    qsl = np.array([0, 5, 6, 13], np.int32)
    lens = np.array(ctx, np.int32)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    want = attention.paged_attention(q, k_cache, v_cache, qsl, lens, tables, 0.17, window, cap)
    for scratch in (dattn.SCRATCH_BYTES, 4096):
        got = dattn.paged_attention(t(q, dev), t(k_cache, dev), t(v_cache, dev), qsl, lens, t(tables, dev), 0.17,
                                    window, cap, scratch_bytes=scratch).cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("kv", KV_DTYPES)
def test_write_kv_matches(dev, kv):
    """The device's rows are the CPU's bytes: fp8 values past the format's range saturate, q8_0 blocks of zeros
    and of one value, values over 30 binades."""
    rng = np.random.default_rng(7)
    k, v = ((rng.standard_normal((5, 2, 64)) * np.exp2(rng.integers(-15, 15, (5, 2, 1)))).astype(np.float32)
            for _ in range(2))
    k[0, 0, :32] = 0
    k[1, 1, :32] = 0
    k[1, 1, 3] = 1e6
    slots = np.array([3, 17, 4, 30, 8], np.int64)
    kc, vc = (layer_cache(LayerKV(2, 64), 8, 4, kv)[0] for _ in range(2))
    attention.write_kv(k, v, kc, vc, slots)
    tk, tv = torch.zeros(kc.shape, dtype=t(kc, "cpu").dtype, device=dev), torch.zeros(vc.shape, dtype=t(vc, "cpu").dtype,
                                                                                        device=dev)
    dattn.write_kv(t(k, dev), t(v, dev), tk, tv, t(slots, dev))
    np.testing.assert_array_equal(tk.cpu().numpy().view(kc.dtype), kc)
    np.testing.assert_array_equal(tv.cpu().numpy().view(vc.dtype), vc)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("fmt", ["packed", "float32", "bfloat16"])
def test_device_linear_matches_quantlinear(dev, fmt):
    from cpu_kernels.quant.linear import QuantLinear
    from gpu_kernels.linear import DeviceLinear, DeviceWeight
    rng = np.random.default_rng(8)
    w = rng.standard_normal((40, 256)).astype(np.float32)
    raw = quantize(Q.Q4_K, w)
    ql = QuantLinear.from_raw(Q.Q4_K, raw, (40, 256))
    x = rng.standard_normal((3, 256)).astype(np.float32)
    want = x @ ql.dequantize().T
    lin = DeviceLinear(DeviceWeight.build(ql, raw, fmt, torch.device(dev), torch.float32))
    got = lin(t(x, dev)).cpu().numpy()
    tol = 2e-2 if fmt == "bfloat16" else 1e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
