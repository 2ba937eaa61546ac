"""A GGUF file whose layer matrices are in llama.cpp's grid i-quants, ternary formats and NVFP4 (one format per
matrix, all ten in one model) against transformers running the values the file decodes to. ramlm cannot write
these formats (llama.cpp's quantizer does), so the matrices are random blocks of each file layout."""
from __future__ import annotations

import copy

import gguf
import numpy as np
import pytest
import torch

from bench.make_synthetic import random_tensor
from cpu_kernels.quant.qtypes import dequantize
from engine.model.gguf_export import write_gguf
from engine.model.loader import load_model
from tests.model.test_architectures import PROMPTS, assert_quantized_close, run_batched, run_incremental
from tests.model.tiny_models import hf_logits, saved_tiny

Q = gguf.GGMLQuantizationType
GRID = [Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.TQ1_0, Q.TQ2_0, Q.NVFP4]
# GGUF matrix kind -> transformers' projection name (qwen3 keeps both row orders)
KINDS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj"}


@pytest.fixture(scope="module")
def grid_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    hf, ws = saved_tiny(root / "float", "qwen3")
    rng = np.random.default_rng(0)
    quantized, ref, types = {}, copy.deepcopy(hf), {}
    params = dict(ref.named_parameters())
    for i, (layer, kind) in enumerate((l, k) for l in range(ref.config.num_hidden_layers) for k in KINDS):
        t = GRID[i % len(GRID)]
        name = f"blk.{layer}.{kind}.weight"
        shape = tuple(ws.info(name).shape)
        raw = random_tensor(rng, t, shape, std=0.03)
        quantized[name], types[name] = (t, raw), t
        with torch.no_grad():
            params[f"model.layers.{layer}.{KINDS[kind]}.weight"].copy_(
                torch.from_numpy(dequantize(raw, t).reshape(shape)))
    path = str(root / "grid.gguf")
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()}, quantized=quantized)
    return path, types, [hf_logits(ref, p).numpy() for p in PROMPTS]


def test_grid_gguf_loads_each_matrix_in_its_format(grid_case):
    path, types, _ = grid_case
    assert set(types.values()) == set(GRID)
    model, _ = load_model(path)
    for name, t in types.items():
        assert model.weights.info(name).ggml_type == t


def test_grid_gguf_matches_transformers_on_decoded_weights(grid_case):
    """The kernels round the activations to int8 per 32 values, as llama.cpp's do (about 0.5 %)."""
    path, _, refs = grid_case
    model, _ = load_model(path)
    for got, ref in zip(run_batched(model, PROMPTS), refs):
        assert_quantized_close("qwen3", got, ref)
    assert_quantized_close("qwen3", run_incremental(model, PROMPTS[0], 6), refs[0])
