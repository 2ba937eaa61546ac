"""GGUF files in llama.cpp's IQ4 formats (IQ4_XS for most matrices, IQ4_NL for attn_v and ffn_down, as its IQ4
mixes keep some rows in 32-value blocks) against transformers running the values the file decodes to."""
from __future__ import annotations

import copy

import gguf
import numpy as np
import pytest
import torch

from cpu_kernels.quant import quantize
from cpu_kernels.quant.qtypes import dequantize
from engine.model.gguf_export import write_gguf
from engine.model.loader import load_model
from engine.model.weights import open_weights
from tests.model.test_architectures import PROMPTS, assert_quantized_close, run_batched, run_incremental
from tests.model.tiny_models import hf_logits, saved_tiny

Q = gguf.GGMLQuantizationType


def iq4_type(name: str) -> Q:
    """The format of a layer matrix, by GGUF name (attn_v, ffn_down) or HF name (v_proj, down_proj)."""
    return Q.IQ4_NL if any(k in name for k in (".attn_v.", "ffn_down", "v_proj", "down_proj")) else Q.IQ4_XS


def decoded(w: np.ndarray, t: Q) -> np.ndarray:
    return dequantize(quantize(t, w), t).reshape(w.shape)


@pytest.fixture(scope="module")
def iq4_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("iq4")
    hf, ws = saved_tiny(root / "float", "qwen3")
    path = str(root / "iq4.gguf")
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()},
               lambda name, shape: iq4_type(name) if name.startswith("blk.") and len(shape) == 2 else Q.F32)
    ref = copy.deepcopy(hf)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.startswith("model.layers.") and name.endswith("_proj.weight"):
                p.copy_(torch.from_numpy(decoded(p.numpy(), iq4_type(name))))
    return path, [hf_logits(ref, p).numpy() for p in PROMPTS]


def test_iq4_gguf_loads_in_its_formats(iq4_case):
    path, _ = iq4_case
    ws = open_weights(path)
    assert ws.info("blk.0.attn_q.weight").ggml_type == Q.IQ4_XS
    assert ws.info("blk.1.ffn_down.weight").ggml_type == Q.IQ4_NL
    model, _ = load_model(path)
    assert model.weights.info("blk.1.attn_v.weight").ggml_type == Q.IQ4_NL


def test_iq4_gguf_matches_transformers_on_decoded_weights(iq4_case):
    """The IQ4 kernels round the activations to int8 per 32 values, as llama.cpp's do (about 0.5 %)."""
    path, refs = iq4_case
    model, _ = load_model(path)
    for got, ref in zip(run_batched(model, PROMPTS), refs):
        assert_quantized_close("qwen3", got, ref)
    assert_quantized_close("qwen3", run_incremental(model, PROMPTS[0], 6), refs[0])
