"""quantization= (vLLM's argument): float weights quantized as they load. q8_0 gives llama.cpp's Q8_0 bits (the same
model as a Q8_0 GGUF of the weights, bit for bit); fp8 matches transformers on the values it decodes to."""
from __future__ import annotations

import copy

import gguf
import numpy as np
import pytest
import torch

from cpu_kernels.quant.fp8_quant import quantize_rows
from engine import LLM, SamplingParams
from engine.args import EngineArgs
from engine.model.gguf_export import write_gguf
from engine.model.hf_quant_writer import write_quantized_folder
from engine.model.loader import load_model
from engine.model.online_quant import QuantizedWeights, quantizable, quantize_at_load, target_type
from engine.model.weights import open_weights
from tests.model.test_architectures import PROMPTS, rel_err, run_batched, run_incremental
from tests.model.tiny_models import hf_logits, save_tiny_tokenizer, tiny_model

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model = tiny_model("qwen3")
    path = tmp_path_factory.mktemp("online-quant")
    model.save_pretrained(path, safe_serialization=True)
    save_tiny_tokenizer(path)
    return str(path), model


def test_q8_0_is_llama_cpp_q8_0(folder):
    path, _ = folder
    ws = open_weights(path)
    qw = QuantizedWeights(ws, "q8_0")
    done = [n for n in qw.names() if qw.info(n).ggml_type == Q.Q8_0]
    assert {"token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight"} <= set(done)
    assert qw.info("blk.0.attn_norm.weight").ggml_type == Q.F32
    for name in done:
        want = gguf.quants.quantize(np.asarray(ws.raw(name), np.float32).reshape(-1, ws.info(name).shape[-1]), Q.Q8_0)
        np.testing.assert_array_equal(qw.raw(name).reshape(want.shape), want)
        assert qw.info(name).nbytes == want.nbytes


@pytest.mark.parametrize("method", ["q8_0", "q4_k"])
def test_online_model_is_the_gguf_of_its_weights(folder, tmp_path, method):
    """The same weights written as a GGUF of that type (the same tensors quantized) give the same logits, bit for
    bit."""
    path, _ = folder
    ws = open_weights(path)
    gguf_path = str(tmp_path / f"{method}.gguf")
    tensors = {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()}
    write_gguf(gguf_path, ws.config, tensors, lambda name, shape: target_type(method, shape)
               if quantizable(name, ws.info(name), method) else Q.F32)
    online, _ = load_model(path, weights=QuantizedWeights(open_weights(path), method))
    assert online.weights.info("blk.0.ffn_up.weight").ggml_type == {"q8_0": Q.Q8_0, "q4_k": Q.Q4_K}[method]
    offline, _ = load_model(gguf_path)
    for a, b in zip(run_batched(online, PROMPTS), run_batched(offline, PROMPTS)):
        np.testing.assert_array_equal(a, b)


def test_fp8_matches_transformers_on_the_decoded_weights(folder):
    path, hf = folder
    qw = QuantizedWeights(open_weights(path), "fp8")
    assert qw.info("blk.0.ffn_up.weight").ggml_type.name == "FP8_E4M3"
    assert qw.info("token_embd.weight").ggml_type == Q.F32 and qw.info("output.weight").ggml_type == Q.F32
    ref = copy.deepcopy(hf)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.startswith("model.layers.") and name.endswith("_proj.weight"):
                q, scale = quantize_rows(p.numpy())
                dec = torch.from_numpy(q).view(torch.float8_e4m3fn).to(torch.float32).numpy()
                p.copy_(torch.from_numpy(dec * np.repeat(scale, 128, axis=1)))
    model, _ = load_model(path, weights=qw)
    refs = [hf_logits(ref, p).numpy() for p in PROMPTS]
    for got, want in zip(run_batched(model, PROMPTS), refs):
        assert rel_err(got, want) < 2e-3
    assert rel_err(run_incremental(model, PROMPTS[0], 5), refs[0]) < 2e-3
    assert rel_err(run_batched(model, PROMPTS)[0], hf_logits(hf, PROMPTS[0]).numpy()) > 1e-3  # it did quantize


def test_llm_quantization_argument(folder):
    path, _ = folder
    llm = LLM(model=path, quantization="fp8", max_model_len=64, kv_cache_memory=0.05)
    out = llm.generate({"prompt_token_ids": PROMPTS[1]}, SamplingParams(max_tokens=4, temperature=0))[0]
    assert len(out.outputs[0].token_ids) == 4
    types = {llm.llm_engine.model.weights.info(n).ggml_type.name for n in llm.llm_engine.model.weights.names()}
    assert "FP8_E4M3" in types


@pytest.mark.parametrize("method", ["awq", "gptq", "bitsandbytes"])
def test_other_methods_are_refused(method):
    with pytest.raises(ValueError, match="quantization must be one of fp8, q8_0, q4_k, int8, int4"):
        EngineArgs(quantization=method)


def test_a_quantized_checkpoint_keeps_its_own_scheme(folder, tmp_path):
    path, _ = folder
    write_quantized_folder(path, str(tmp_path / "fp8"))
    ws = open_weights(str(tmp_path / "fp8"))
    assert quantize_at_load(ws, "fp8") is ws
    with pytest.raises(ValueError, match="already quantized .quant_method 'fp8'.; quantization='q8_0'"):
        quantize_at_load(ws, "q8_0")


@pytest.mark.parametrize("method, bits, group", [("int8", 8, None), ("int4", 4, 128)])
def test_int_methods_hold_round_to_nearest_values(folder, method, bits, group):
    """int8 / int4: the linear layers only; each weight is fp16 scale (amax / (2^(bits-1) - 1) per row or per 128
    values) times the nearest integer, computed here on its own; the logits follow transformers on those values."""
    path, hf = folder
    ws = open_weights(path)
    qw = QuantizedWeights(ws, method)
    assert qw.info("token_embd.weight").ggml_type == Q.F32 and qw.info("output.weight").ggml_type == Q.F32
    from cpu_kernels.quant import QuantLinear
    name = "blk.1.ffn_down.weight"
    w = np.asarray(ws.raw(name), np.float32)
    g = w.reshape(w.shape[0], -1, group or w.shape[1])  # int8: one scale per row
    top = 2 ** (bits - 1) - 1
    s = (np.abs(g).max(-1) / top).astype(np.float16).astype(np.float32)[..., None]
    want = (np.clip(np.rint(g / s), -top - 1, top) * s).reshape(w.shape)
    info = qw.info(name)
    got = QuantLinear.from_raw(info.ggml_type, qw.raw(name), info.shape).dequantize()
    np.testing.assert_array_equal(got, want)
    ref = copy.deepcopy(hf)
    with torch.no_grad():
        for pname, p in ref.named_parameters():
            if pname.startswith("model.layers.") and pname.endswith("_proj.weight"):
                a = p.numpy().reshape(p.shape[0], -1, group or p.shape[1])
                sc = (np.abs(a).max(-1) / top).astype(np.float16).astype(np.float32)[..., None]
                p.copy_(torch.from_numpy((np.clip(np.rint(a / sc), -top - 1, top) * sc).reshape(p.shape)))
    model, _ = load_model(path, weights=qw)
    from tests.model.test_architectures import assert_quantized_close
    refs = [hf_logits(ref, p).numpy() for p in PROMPTS]
    for got_l, want_l in zip(run_batched(model, PROMPTS), refs):
        assert_quantized_close("qwen3", got_l, want_l)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_parallel_int_quantizer_equals_numpy(method):
    """The Numba int8 / int4 quantizer gives the numpy reference's rows bit for bit (zero groups, 30 binades)."""
    from engine.model.online_quant import int_rtn, int_rtn_numpy
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((24, 512)) * np.exp2(rng.integers(-20, 10, (24, 512)))).astype(np.float32)
    w[0] = 0.0
    w[1, :128] = 0.0
    np.testing.assert_array_equal(int_rtn(w, method), int_rtn_numpy(w, method))
