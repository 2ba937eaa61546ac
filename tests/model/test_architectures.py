"""Every architecture against HF transformers on a tiny random model: fp32 folders and quantized GGUFs."""
from __future__ import annotations

import copy

import gguf
import numpy as np
import pytest
import torch

from engine.model.gguf_export import default_qtype, write_gguf
from engine.model.loader import load_model
from engine.worker.runner import ModelRunner, SeqChunk
from tests.model.tiny_models import ARCHES, MOE_ARCHES, gguf_rows, hf_logits, tiny_model

PROMPTS = [[5, 17, 99, 3, 250, 42, 7, 8, 9, 200, 13, 77, 31], [1, 2, 3, 4, 5, 6, 7]]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def blocks_for(seq: int, n: int, per: int = 8) -> tuple[int, ...]:
    # Interleaved, non-contiguous block ids so that the block table really is followed.
    return tuple(1 + seq + 2 * i for i in range(per))[: max(1, n)]


def run_batched(model, prompts, kv="fp32", block_size=4):
    runner = ModelRunner(model, num_blocks=40, block_size=block_size, kv_cache_dtype=kv)
    chunks = [SeqChunk(tuple(p), 0, blocks_for(s, 8), "all", state_slot=s + 1)  # each sequence its state slot
              for s, p in enumerate(prompts)]
    return runner.execute(chunks)


def run_incremental(model, prompt, split, kv="fp32", block_size=4):
    """Prefill `split` tokens, then feed the rest one at a time (decode through the cache)."""
    runner = ModelRunner(model, num_blocks=40, block_size=block_size, kv_cache_dtype=kv)
    blocks = blocks_for(0, 8)
    rows = [runner.execute([SeqChunk(tuple(prompt[:split]), 0, blocks, "all")])[0]]
    for i in range(split, len(prompt)):
        rows.append(runner.execute([SeqChunk((prompt[i],), i, blocks, "last")])[0])
    return np.concatenate(rows)


@pytest.fixture(scope="module", params=ARCHES)
def hf_folder(request, tmp_path_factory):
    arch = request.param
    model = tiny_model(arch)
    path = tmp_path_factory.mktemp(arch)
    model.save_pretrained(path, safe_serialization=True)
    refs = [hf_logits(model, p).numpy() for p in PROMPTS]
    return arch, str(path), refs, model


def test_fp32_batched_matches_transformers(hf_folder):
    arch, path, refs, _ = hf_folder
    model, cfg = load_model(path)
    assert cfg.arch == arch
    out = run_batched(model, PROMPTS)
    for got, ref in zip(out, refs):
        assert rel_err(got, ref) < 2e-3, arch


def test_fp32_through_cache_matches_transformers(hf_folder):
    arch, path, refs, _ = hf_folder
    model, _ = load_model(path)
    got = run_incremental(model, PROMPTS[0], 6)
    assert rel_err(got, refs[0]) < 2e-3, arch


def test_fp16_kv_cache_close(hf_folder):
    arch, path, refs, _ = hf_folder
    model, _ = load_model(path)
    got = run_incremental(model, PROMPTS[0], 3, kv="fp16", block_size=16)
    assert rel_err(got, refs[0]) < 1e-2, arch


@pytest.mark.parametrize("quant", [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_K])
def test_quantized_gguf_matches_transformers_on_dequantized_weights(hf_folder, quant, tmp_path):
    """Round-trip the HF weights through the format first, so both sides hold the same values; then
    write them to a quantized GGUF and compare ramlm on it with transformers."""
    from cpu_kernels.quant.quantize import quantize
    from engine.model.weights import open_weights
    arch, _, _, hf_model = hf_folder
    if arch in RECURRENT_MOE:  # every row to every expert: no expert choice for rounding to flip
        hf_model = tiny_model(arch, num_experts_per_tok=hf_model.config.num_experts)
    block = gguf.GGML_QUANT_SIZES[quant][0]
    ref_model = copy.deepcopy(hf_model)
    with torch.no_grad():
        for name, p in ref_model.named_parameters():
            rows = gguf_rows(arch, name, p)
            if rows is not None and rows.shape[-1] % block == 0:
                flat = rows.detach().numpy().reshape(-1, rows.shape[-1])
                deq = gguf.quants.dequantize(quantize(quant, flat), quant)
                rows.copy_(torch.from_numpy(np.ascontiguousarray(deq, dtype=np.float32)).reshape(rows.shape))
    folder = tmp_path / "roundtrip"
    ref_model.save_pretrained(folder, safe_serialization=True)
    ws = open_weights(str(folder))
    tensors = {n: np.asarray(ws.raw(n), dtype=np.float32) for n in ws.names()}
    gguf_path = str(tmp_path / f"{arch}-{quant.name}.gguf")
    write_gguf(gguf_path, ws.config, tensors, default_qtype(quant))
    model, cfg = load_model(gguf_path)
    assert cfg.arch == arch
    refs = [hf_logits(ref_model, p).numpy() for p in PROMPTS]
    for got, ref in zip(run_batched(model, PROMPTS), refs):
        assert_quantized_close(arch, got, ref)
    assert_quantized_close(arch, run_incremental(model, PROMPTS[0], 5), refs[0])


# MoE models with recurrent layers: an expert flipped by rounding at a near tie changes the layer's state, and so every
# later row (in attention models it stays in its row), and the tiny random routers tie often (qwen35moe, layer 0, row 2
# of PROMPTS[1]: 0.1882 vs 0.1875). Their quantized comparison routes to all experts; the fp32 tests check the top-k.
RECURRENT_MOE = {"qwen35moe"}
# qwen3.5: three of its 4 layers are Gated DeltaNet, whose per-head output is RMS-normalised after products q.k of
# random unit vectors (~1/8 here): the 0.5 % int8 rounding of q and k becomes ~4 % of q.k and the norm keeps it, so
# hidden states drift 2-3 % per layer. transformers itself, with only its nn.Linear inputs rounded to int8 per 32
# values, moves the logits by 5.9/4.6 % (qwen35) and 6.9/6.2 % (qwen35moe, experts not rounded) on average (qwen3:
# 2 %), up to 7.5/13.6 % at the worst logit. ramlm's Q8_0/Q4_K files (which round every matmul input, as llama.cpp
# does) measured 5.2-5.6 % and 8.6-13 %; an F32 GGUF matches to 3e-6 (tests/model/test_qwen35.py), and value heads in
# the wrong order give 99-130 %. So these compare the mean error.
MEAN_TOL = {"qwen35": 0.1, "qwen35moe": 0.2}


def assert_quantized_close(arch, got, ref, tol=5e-2):
    if arch in MEAN_TOL:
        err = float(np.abs(got - ref).mean() / np.abs(ref).mean())
        assert err < MEAN_TOL[arch], err
        return
    if arch in MOE_ARCHES:
        # Quantized paths round activations to int8 per block (as llama.cpp does); the router's top-k is
        # discontinuous, so that 0.5 % error can swap an expert on a row whose router is near a tie.
        ok = [rel_err(g, r) < tol for g, r in zip(got, ref)]
        assert sum(ok) >= 0.75 * len(ok), ok
    else:
        assert rel_err(got, ref) < tol
