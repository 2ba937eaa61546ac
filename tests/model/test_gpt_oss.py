"""gpt-oss beyond the registry walk (test_architectures, test_block_paths): an HF folder in the published MXFP4
layout against transformers' own dequantization of it, its GGUF export with the MXFP4 experts kept as they are,
a GGUF with float experts quantized to MXFP4, and the file's layout as llama.cpp reads it."""
from __future__ import annotations

import copy
import json

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from cpu_kernels.quant.quantize import quantize
from engine.model.gguf_export import write_gguf
from engine.model.loader import load_model
from engine.model.mxfp4_hf import gguf_to_hf, hf_to_gguf
from engine.model.weights import open_weights
from tests.model.test_architectures import PROMPTS, assert_quantized_close, run_batched, run_incremental
from tests.model.tiny_models import hf_logits, tiny_model

Q = gguf.GGMLQuantizationType
MXFP4_CONFIG = {"quant_method": "mxfp4",  # gpt-oss-20b's config.json
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}


def hf_mxfp4(w_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(E, N, K) float weights (rows = outputs) -> the checkpoint's (blocks (E, N, K/32, 16), scales (E, N, K/32))."""
    E, N, K = w_out.shape
    raw = quantize(Q.MXFP4, w_out.reshape(E * N, K)).reshape(E, N, -1)
    return gguf_to_hf(raw)


def transformers_dequant(blocks, scales) -> torch.Tensor:
    """transformers' own MXFP4 dequantization (integrations/mxfp4.py), as the parameter's (E, K, N)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    return convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)


def test_nibble_order_matches_transformers():
    """gguf's dequantize of hf_to_gguf(blocks, scales) is transformers' dequantization of the same blocks (random
    bytes: every code and a spread of exponents; equal as numbers: transformers' code 8 is -0.0, gguf's +0.0), and
    gguf_to_hf inverts hf_to_gguf."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 5, 4, 16)).astype(np.uint8)
    scales = rng.integers(110, 140, (3, 5, 4)).astype(np.uint8)
    raw = hf_to_gguf(blocks, scales)
    assert raw.shape == (3, 5, 4 * 17)
    ours = gguf.quants.dequantize(raw.reshape(15, -1), Q.MXFP4).reshape(3, 5, 128)
    theirs = transformers_dequant(blocks, scales).transpose(1, 2).numpy()  # back to (E, N, K)
    np.testing.assert_array_equal(ours, theirs)
    b2, s2 = gguf_to_hf(raw)
    np.testing.assert_array_equal(b2, blocks)
    np.testing.assert_array_equal(s2, scales)


@pytest.fixture(scope="module")
def mxfp4_folder(tmp_path_factory):
    """A tiny gpt-oss saved as the published checkpoints are (experts as *_blocks/*_scales, quantization_config
    mxfp4), and transformers' model with those experts dequantized by transformers, with its logits."""
    model = tiny_model("gpt-oss")
    ref = copy.deepcopy(model)
    folder = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    tensors = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for layer, experts in enumerate(m.mlp.experts for m in ref.model.layers):
            for proj in ("gate_up_proj", "down_proj"):
                name = f"model.layers.{layer}.mlp.experts.{proj}"
                blocks, scales = hf_mxfp4(getattr(experts, proj).detach().numpy().transpose(0, 2, 1))
                del tensors[name]
                tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
                getattr(experts, proj).copy_(transformers_dequant(blocks, scales))
    save_file(tensors, str(folder / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = MXFP4_CONFIG
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder), ref, [hf_logits(ref, p).numpy() for p in PROMPTS]


def test_hf_mxfp4_folder_matches_transformers(mxfp4_folder):
    folder, _, refs = mxfp4_folder
    ws = open_weights(folder)
    for proj, shape in (("gate", (8, 128, 256)), ("up", (8, 128, 256)), ("down", (8, 256, 128))):
        info = ws.info(f"blk.1.ffn_{proj}_exps.weight")
        assert info.ggml_type == Q.MXFP4 and info.shape == shape
    assert not ws.unmapped
    model, cfg = load_model(folder)
    assert cfg.arch == "gpt-oss" and cfg.layer_sliding_window == (4, 0)
    for got, ref in zip(run_batched(model, PROMPTS), refs):
        assert_quantized_close("gpt-oss", got, ref)
    assert_quantized_close("gpt-oss", run_incremental(model, PROMPTS[0], 5), refs[0])


def test_gguf_export_keeps_the_mxfp4_experts(mxfp4_folder, tmp_path):
    """The HF MXFP4 folder exported to GGUF with its experts' blocks as they are (the rest F32): the same weights,
    so the same logits bit for bit; and the file is in llama.cpp's layout (names, ne, types, required keys)."""
    folder, _, refs = mxfp4_folder
    ws = open_weights(folder)
    quantized = {n: (Q.MXFP4, ws.raw(n)) for n in ws.names() if ws.info(n).ggml_type == Q.MXFP4}
    tensors = {n: np.asarray(ws.raw(n), np.float32) for n in ws.names() if n not in quantized}
    path = str(tmp_path / "gpt-oss-mxfp4.gguf")
    write_gguf(path, ws.config, tensors, quantized=quantized)

    r = gguf.GGUFReader(path)
    fields = {f.name for f in r.fields.values()}
    for key in ("expert_count", "expert_used_count", "expert_feed_forward_length", "attention.sliding_window",
                "attention.layer_norm_rms_epsilon", "rope.scaling.type", "rope.scaling.original_context_length"):
        assert f"gpt-oss.{key}" in fields, key
    t = {x.name: x for x in r.tensors}
    assert t["blk.0.ffn_gate_exps.weight"].tensor_type == Q.MXFP4
    assert list(t["blk.0.ffn_gate_exps.weight"].shape) == [256, 128, 8]  # ne {n_embd, n_ff_exp, n_expert}
    assert list(t["blk.0.ffn_down_exps.weight"].shape) == [128, 256, 8]
    assert list(t["blk.0.ffn_gate_exps.bias"].shape) == [128, 8] and list(t["blk.0.attn_sinks.weight"].shape) == [4]
    assert t["blk.0.ffn_gate_inp.weight"].tensor_type == Q.F32 and "blk.1.attn_output.bias" in t

    from_gguf, cfg = load_model(path)
    from_hf, _ = load_model(folder)
    assert cfg.arch == "gpt-oss" and cfg.rope_scaling.truncate is False and cfg.layer_sliding_window == (4, 0)
    got = run_batched(from_gguf, PROMPTS)
    for g, h in zip(got, run_batched(from_hf, PROMPTS)):
        np.testing.assert_array_equal(g, h)
    for g, ref in zip(got, refs):
        assert_quantized_close("gpt-oss", g, ref)


def test_float_experts_quantized_to_mxfp4_in_gguf(tmp_path):
    """A float gpt-oss written to GGUF with its experts quantized to MXFP4 by the writer (and the rest Q8_0):
    transformers on the same dequantized weights agrees."""
    model = tiny_model("gpt-oss", seed=1)
    folder = tmp_path / "hf"
    model.save_pretrained(folder, safe_serialization=True)
    ws = open_weights(str(folder))
    tensors = {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()}

    def pick(name, shape):
        if name.endswith("_exps.weight"):
            return Q.MXFP4
        return Q.Q8_0 if len(shape) == 2 and name.endswith(".weight") and "ffn_gate_inp" not in name else Q.F32
    path = str(tmp_path / "gpt-oss.gguf")
    write_gguf(path, ws.config, tensors, pick)
    ref = copy.deepcopy(model)
    with torch.no_grad():  # the reference holds what the file holds
        for name, p in ref.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                rows = p.transpose(-1, -2)
                q = Q.MXFP4
            elif p.ndim == 2 and "router" not in name:
                rows, q = p, Q.Q8_0
            else:
                continue
            flat = rows.detach().numpy().reshape(-1, rows.shape[-1])
            deq = gguf.quants.dequantize(quantize(q, flat), q)
            rows.copy_(torch.from_numpy(np.ascontiguousarray(deq, np.float32)).reshape(rows.shape))
    gm, _ = load_model(path)
    from engine.model.gguf import open_gguf
    assert open_gguf(path).tensors["blk.0.ffn_up_exps.weight"].ggml_type == Q.MXFP4
    for p in PROMPTS:
        assert_quantized_close("gpt-oss", run_batched(gm, [p])[0], hf_logits(ref, p).numpy())


def test_unsupported_gpt_oss_configs_are_refused(tmp_path):
    from engine.errors import ModelLoadError
    from engine.model.hf_config import config_from_hf
    cfg = tiny_model("gpt-oss").config.to_dict()
    with pytest.raises(ModelLoadError, match="swiglu_limit"):
        config_from_hf({**cfg, "swiglu_limit": 10.0})
    with pytest.raises(ModelLoadError, match="quantization_config"):
        config_from_hf({**cfg, "quantization_config": {"quant_method": "fp8"}})


ENGINE_PROMPTS = [[5, 17, 99, 3, 250, 42, 7, 8, 9, 200, 13, 77, 31, 64, 2, 90, 11], [1, 2, 3, 4, 5, 6, 7],
                  [5, 17, 99, 3, 250, 42, 7, 8, 9, 200, 13, 77, 40, 41], [120, 121, 122, 123, 124, 125, 126, 127, 128],
                  [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 19, 18, 17]]


@pytest.fixture(scope="module")
def engine_folder(tmp_path_factory):
    from tests.model.tiny_models import save_tiny_tokenizer
    folder = tmp_path_factory.mktemp("gpt_oss_engine")
    tiny_model("gpt-oss", seed=2).save_pretrained(folder, safe_serialization=True)
    save_tiny_tokenizer(folder)
    return str(folder)


def _generate(folder, prompts, params, **kw):
    from engine import LLM
    llm = LLM(model=folder, max_model_len=128, kv_cache_memory=0.05, block_size=4, **kw)
    return llm, llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def test_engine_answers_equal_solo_runs(engine_folder):
    """The tiny gpt-oss through the engine (sliding and full layers, sinks): batched, in chunks of 5 and 7 tokens
    (odd, across block and window edges), with prefix-cache hits and with preemption from a tiny block pool, every
    request gets its solo run's tokens (batch_invariant: identical; default: up to the solo run's near ties)."""
    from engine import SamplingParams
    from tests.near_ties import assert_same_up_to_near_ties
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True)
    for invariant in (True, False):
        solo = [_generate(engine_folder, [p], params, batch_invariant=invariant, enable_prefix_caching=False)[1][0]
                for p in ENGINE_PROMPTS]
        runs = [dict(max_num_batched_tokens=5, enable_prefix_caching=False),
                dict(max_num_batched_tokens=7, enable_prefix_caching=True),
                dict(max_num_batched_tokens=64, enable_prefix_caching=False, num_gpu_blocks_override=12)]
        for kw in runs:
            llm, outs = _generate(engine_folder, ENGINE_PROMPTS, params, batch_invariant=invariant, **kw)
            assert llm.llm_engine.kv_manager.windows == (0, 4)  # the sliding layers' own blocks, freed as they leave
            if kw.get("enable_prefix_caching"):  # the same prompts again: their full blocks come from the cache
                outs = llm.generate([{"prompt_token_ids": p} for p in ENGINE_PROMPTS], params, use_tqdm=False)
                assert sum(o.num_cached_tokens for o in outs) > 0
            if "num_gpu_blocks_override" in kw:
                assert llm.llm_engine.scheduler.num_preemptions > 0
            if invariant:
                assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in solo], kw
            else:
                assert_same_up_to_near_ties(solo, outs)
