"""The Triton kernels against gguf's numpy oracle, the Numba kernels and the torch path.

Not collected by a plain `pytest` (the file name): TRITON_INTERPRET must be set before the kernels are
decorated, so test_triton_interpret.py runs this module in a subprocess with TRITON_INTERPRET=1 on CPU
tensors, and bench/gpu_check.sh runs it on a CUDA GPU without it. Shapes are small: the interpreter runs
each program in numpy.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from gpu_kernels import triton_dispatch

INTERPRET = triton_dispatch.interpreting()
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 (CPU tensors) or a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton", reason="triton is not installed")

from cpu_kernels import attention as cattn  # noqa: E402
from cpu_kernels.quant.quantize import quantize  # noqa: E402
from gpu_kernels import attention as dattn  # noqa: E402
from gpu_kernels.dequant import DEQUANT  # noqa: E402
from gpu_kernels.triton_attention import RowLayout, paged_attention_rows  # noqa: E402
from gpu_kernels.triton_dequant import FORMAT_IDS  # noqa: E402
from gpu_kernels.triton_qmatmul import qmatmul  # noqa: E402

DEV = "cpu" if INTERPRET else "cuda"
Q = gguf.GGMLQuantizationType
# GGML's block formats; ramlm's own (FP8_E4M3) dequantize through torch (gpu_kernels/linear.py's block_packed)
TORCH_ONLY = (Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.TQ1_0, Q.TQ2_0, Q.NVFP4)
FORMATS = sorted((q for q in DEQUANT if isinstance(q, Q)), key=lambda q: q.name)


def t(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(DEV)


def weights(qtype, N: int, K: int, seed: int):
    """(GGUF rows uint8 (N, row_bytes), their gguf dequantization f32 (N, K))."""
    w = np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32)
    raw = quantize(qtype, w)
    return raw, gguf.quants.dequantize(raw, qtype)


def k_for(qtype) -> int:
    # Several blocks per row; 96 = 3 blocks of 32 is not a multiple of any power-of-two tile but 32.
    return 512 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 96


def assert_fp32_sum(got, x, W, want):
    """float32 accumulation: each output within a few ulps of sum |x_k w_k| of the float64 answer."""
    bound = np.abs(x).astype(np.float64) @ np.abs(W).astype(np.float64).T
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= 2e-6 * bound).all(), float((err / bound).max())


# ---------------------------------------------------------------- quantized matmul
def test_every_device_format_has_a_triton_dequantizer():
    """All but the table-driven formats (grid i-quants, ternary, NVFP4), which torch dequantizes per tile."""
    assert set(FORMAT_IDS) == set(FORMATS) - set(TORCH_ONLY)


@pytest.mark.parametrize("qtype", [q for q in FORMATS if q not in TORCH_ONLY], ids=lambda q: q.name)
def test_qmatmul_dequantizes_bit_equal_to_gguf(qtype):
    """x = I: y = W^T exactly (one product by 1.0 per output), so this reads the in-kernel dequantization."""
    K = k_for(qtype)
    raw, W = weights(qtype, 40, K, seed=1)
    got = qmatmul(t(np.eye(K, dtype=np.float32)), t(raw), qtype, K).cpu().numpy()
    np.testing.assert_array_equal(got, W.T)


@pytest.mark.parametrize("M", [1, 17, 70])  # the decode, middle and prefill tile configurations
@pytest.mark.parametrize("qtype", [q for q in FORMATS if q not in TORCH_ONLY], ids=lambda q: q.name)
def test_qmatmul_matches_gguf_and_the_torch_path(qtype, M):
    from gpu_kernels.linear import DeviceWeight
    K = k_for(qtype)
    raw, W = weights(qtype, 72, K, seed=2)
    x = np.random.default_rng(3).standard_normal((M, K)).astype(np.float32)
    want = x.astype(np.float64) @ W.astype(np.float64).T
    got = qmatmul(t(x), t(raw), qtype, K).cpu().numpy()
    assert got.shape == (M, 72)
    assert_fp32_sum(got, x, W, want)
    dw = DeviceWeight(t(raw), "packed", qtype, 72, K, torch.device(DEV), torch.float32)
    assert_fp32_sum(got, x, W, dw.matmul_torch(t(x)).cpu().numpy().astype(np.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_qmatmul_rounds_inputs_to_the_compute_dtype_and_accumulates_in_fp32(qtype, dtype):
    if INTERPRET and dtype == torch.bfloat16:
        # triton 3.9's interpreter multiplies bfloat16 dot operands as their raw bits (results ~1e10) and
        # truncates float32 -> bfloat16 instead of rounding to nearest: bfloat16 is checked on GPUs only.
        pytest.skip("bfloat16 tl.dot is wrong in the Triton interpreter")
    K = k_for(qtype)
    raw, W = weights(qtype, 40, K, seed=4)
    x = np.random.default_rng(5).standard_normal((5, K)).astype(np.float32)

    def rounded(a):
        return torch.from_numpy(a).to(dtype).to(torch.float64).numpy()
    xr, Wr = rounded(x), rounded(W)
    got = qmatmul(t(x), t(raw), qtype, K, dtype).cpu().numpy()
    assert_fp32_sum(got, xr, Wr, xr @ Wr.T)


def test_qmatmul_rejects_rows_of_another_width():
    raw, _ = weights(Q.Q8_0, 8, 64, seed=6)
    with pytest.raises(ValueError):
        qmatmul(t(np.zeros((2, 96), np.float32)), t(raw), Q.Q8_0, 96)


def test_device_linear_uses_the_kernel_for_few_rows(monkeypatch):
    from cpu_kernels.quant.linear import QuantLinear
    from gpu_kernels.linear import TRITON_MAX_M, DeviceLinear, DeviceWeight
    raw, W = weights(Q.Q4_K, 40, 256, seed=7)
    lin = DeviceLinear(DeviceWeight.build(QuantLinear.from_raw(Q.Q4_K, raw, (40, 256)), raw, "packed",
                                          torch.device(DEV), torch.float32))
    rng = np.random.default_rng(8)
    for M, launches in ((3, 1), (TRITON_MAX_M + 1, 0)):
        x = rng.standard_normal((M, 256)).astype(np.float32)
        before = triton_dispatch.calls["qmatmul"]
        got = lin(t(x)).cpu().numpy()
        assert triton_dispatch.calls["qmatmul"] - before == launches
        assert_fp32_sum(got, x, W, x.astype(np.float64) @ W.astype(np.float64).T)
    monkeypatch.setenv("RAMLM_TRITON", "0")
    before = triton_dispatch.calls["qmatmul"]
    lin(t(x[:2]))
    assert triton_dispatch.calls["qmatmul"] == before


# ---------------------------------------------------------------- paged attention
def cache_case(seed, NB, BS, Hkv, Hq, D, q_lens, ctx, kv_dtype):
    """Random caches, shuffled block tables, queries for sequences of q_lens rows over ctx positions."""
    rng = np.random.default_rng(seed)
    k_cache = (rng.standard_normal((NB, BS, Hkv, D)) * 0.5).astype(kv_dtype)
    v_cache = rng.standard_normal((NB, BS, Hkv, D)).astype(kv_dtype)
    per = max(-(-c // BS) for c in ctx)
    perm = rng.permutation(np.arange(1, NB))
    tables = np.zeros((len(ctx), per + 1), np.int32)  # one spare column of padding, as the runner has
    for s, c in enumerate(ctx):
        n = -(-c // BS)
        tables[s, :n] = perm[per * s: per * s + n]
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), Hq, D)).astype(np.float32)
    return q, k_cache, v_cache, qsl, np.array(ctx, np.int32), tables


LAYOUTS = {
    # (NB, BS, Hkv, Hq, D, q_lens, ctx)
    "decode-gqa": (80, 4, 2, 4, 32, [1, 1, 1, 1], [1, 9, 33, 70]),       # 70 keys: several 32-key tiles
    "decode-mha-d40": (40, 16, 3, 3, 40, [1, 1], [17, 50]),               # G = 1, head_dim not a power of 2
    "decode-g8": (30, 16, 1, 8, 64, [1, 1, 1], [16, 32, 100]),
    "mixed": (24, 4, 2, 4, 32, [5, 1, 7], [9, 13, 7]),                    # prefill chunks are rows too
}


@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("window,cap", [(0, 0.0), (5, 0.0), (0, 20.0), (7, 30.0)])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_paged_attention_matches_numba_and_torch(layout, window, cap, kv_dtype):
    NB, BS, Hkv, Hq, D, q_lens, ctx = LAYOUTS[layout]
    q, kc, vc, qsl, lens, tables = cache_case(9, NB, BS, Hkv, Hq, D, q_lens, ctx, kv_dtype)
    want = cattn.paged_attention(q, kc, vc, qsl, lens, tables, 0.17, window, cap)
    args = (t(q), t(kc), t(vc))
    got = paged_attention_rows(*args, RowLayout(qsl, lens, DEV), t(tables), 0.17, window, cap).cpu().numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    ref = dattn.paged_attention(*args, qsl, lens, t(tables), 0.17, window, cap).cpu().numpy()
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("layout", ["decode-gqa", "decode-g8", "mixed"])
def test_paged_attention_with_sinks_matches_numba_and_torch(layout, window):
    """gpt-oss's attention sinks: per-head logits in the softmax's denominator only (both paths, both kernels)."""
    NB, BS, Hkv, Hq, D, q_lens, ctx = LAYOUTS[layout]
    q, kc, vc, qsl, lens, tables = cache_case(11, NB, BS, Hkv, Hq, D, q_lens, ctx, np.float16)
    sinks = (np.random.default_rng(12).standard_normal(Hq) * 3 + np.linspace(-20, 8, Hq)).astype(np.float32)
    want = cattn.paged_attention(q, kc, vc, qsl, lens, tables, 0.17, window, sinks=sinks)
    args = (t(q), t(kc), t(vc))
    got = paged_attention_rows(*args, RowLayout(qsl, lens, DEV), t(tables), 0.17, window, sinks=t(sinks))
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=2e-5, atol=2e-5)
    ref = dattn.paged_attention(*args, qsl, lens, t(tables), 0.17, window, sinks=t(sinks)).cpu().numpy()
    np.testing.assert_allclose(ref, want, rtol=2e-5, atol=2e-5)
    assert np.abs(want - cattn.paged_attention(q, kc, vc, qsl, lens, tables, 0.17, window)).max() > 1e-2


def test_paged_attention_leaves_rows_outside_the_sequences_zero():
    q, kc, vc, qsl, lens, tables = cache_case(10, 12, 4, 1, 2, 16, [1, 1], [3, 6], np.float16)
    q = np.concatenate([q, np.ones((2, 2, 16), np.float32)])  # two padding rows after the sequences
    got = paged_attention_rows(t(q), t(kc), t(vc), RowLayout(qsl, lens, DEV), t(tables), 0.25).cpu().numpy()
    assert (got[2:] == 0).all() and np.abs(got[:2]).max() > 0
    np.testing.assert_allclose(got[:2], cattn.paged_attention(q[:2], kc, vc, qsl, lens, tables, 0.25),
                               rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------- a placed model
def test_placed_q4k_layer_with_triton_matches_the_torch_path(tmp_path, monkeypatch):
    """The last layer packed Q4_K on the device, through the runner: a prefill of two prompts and a decode
    step of both with the Triton kernels give the torch kernels' logits to float32 summation order. (One
    layer: the interpreter takes about a second per matmul.)"""
    from engine.model.gguf_export import default_qtype, write_gguf
    from engine.model.weights import open_weights
    from tests.model.tiny_models import tiny_model
    from tests.offload.helpers import decode_batch, placed, rel_err
    tiny_model("llama").save_pretrained(tmp_path, safe_serialization=True)
    ws = open_weights(str(tmp_path))
    path = str(tmp_path / "q4_k.gguf")
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), dtype=np.float32) for n in ws.names()},
               default_qtype(Q.Q4_K))
    kw = dict(kv="fp16", gpu_device="cpu" if INTERPRET else "cuda:0", n_gpu_layers="1", gpu_weight_dtype="packed")
    before = dict(triton_dispatch.calls)
    got = decode_batch(placed(path, **kw)[1])
    for name in ("qmatmul", "paged_attention"):
        assert triton_dispatch.calls[name] > before.get(name, 0), name
    monkeypatch.setenv("RAMLM_TRITON", "0")
    want = decode_batch(placed(path, **kw)[1])
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-5
