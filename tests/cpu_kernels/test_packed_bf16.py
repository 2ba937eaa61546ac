"""packed_bf16: an F32 weight's kept oneDNN copy gives the bf16 prefill exactly what the per-call path gives for the
same bf16 weight, a row's bits whatever the call's rows, and is made once."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from cpu_kernels.quant import QuantLinear, quantize
from cpu_kernels.quant import packed_bf16
from cpu_kernels.quant.bf16_io import to_bf16

torch = pytest.importorskip("torch")
N, K, M = 200, 96, 150


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, K)).astype(np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    f32 = QuantLinear.from_raw(Q.F32, w, (N, K))
    bf16 = QuantLinear.from_raw(Q.BF16, to_bf16(w), (N, K))  # the same values, on the per-call path
    return f32, bf16, x, bias


def test_the_packed_copy_gives_the_per_call_paths_bits():
    f32, bf16, x, bias = _weights()
    got = f32.matmul(x, dense_dtype="bfloat16", bias=bias)
    assert getattr(f32, "_bf16_packed", None) is not None and packed_bf16.packed_weight(bf16) is None
    want = bf16.matmul(x, dense_dtype="bfloat16", bias=bias)
    np.testing.assert_array_equal(got, want)
    # and what torch gives on those bf16 values: the product rounded to bf16, then widened and the bias added
    prod = torch.mm(torch.from_numpy(x).bfloat16(), torch.from_numpy(f32.dequantize()).bfloat16().T)
    np.testing.assert_array_equal(got, prod.float().numpy() + bias)


def test_spans_and_chunked_calls_give_each_row_its_own_bits(monkeypatch):
    f32, _bf16, x, bias = _weights(1)
    whole = f32.matmul(x, dense_dtype="bfloat16", bias=bias)
    spans = [(0, 40), (40, 97), (110, 150)]
    y = np.full((M, N), np.nan, np.float32)
    f32.matmul_spans(x, spans, y, "bfloat16", bias)
    for a, b in spans:
        np.testing.assert_array_equal(y[a:b], f32.matmul(x[a:b], dense_dtype="bfloat16", bias=bias))
        np.testing.assert_array_equal(y[a:b], whole[a:b])
    assert np.isnan(y[97:110]).all()  # rows outside the spans untouched
    monkeypatch.setattr(packed_bf16, "OUT_ELEMS", 7 * N)  # seven rows per oneDNN call
    np.testing.assert_array_equal(f32.matmul(x, dense_dtype="bfloat16", bias=bias), whole)


def test_made_once_and_only_for_f32():
    f32, _bf16, x, _bias = _weights(2)
    first = packed_bf16.packed_weight(f32)
    assert first is not None and packed_bf16.packed_weight(f32) is first
    w = np.random.default_rng(3).standard_normal((N, K)).astype(np.float32)
    q8 = QuantLinear.from_raw(Q.Q8_0, quantize(Q.Q8_0, w), (N, K))
    assert packed_bf16.packed_weight(q8) is None
