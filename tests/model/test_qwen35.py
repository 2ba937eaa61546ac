"""Qwen3.5 beyond the registry-wide tests: an F32 GGUF in llama.cpp's layout (names, keys, shapes) against transformers
over a prompt long enough for the chunked delta rule, full checkpoints nesting text_config (vision skipped, said in
the log), and the MTP layer kept (HF mtp.* -> GGUF blk.{L}.nextn.*, nextn_layers counted, not run)."""
from __future__ import annotations

import json
import logging

import gguf
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file

from engine.core.kv_spec import LayerKV, LayerState, layout_state_bytes
from engine.model.gguf import open_gguf
from engine.model.gguf_export import write_gguf
from engine.model.loader import load_model
from engine.model.weights import open_weights
from engine.worker.runner import ModelRunner, SeqChunk
from offload.apply import paged_caches
from tests.model.tiny_models import hf_logits, randomize, tiny_config, tiny_model

LONG = [int(t) for t in np.random.default_rng(3).integers(0, 256, 150)]  # > 64 rows: the chunked form
Q = gguf.GGMLQuantizationType


def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def run(model, prompt, split=None):
    """Logits of every row: one chunk, or `split` rows then the rest one by one (the state through the cache); long
    chunks in float32 (dtype float32: the correctness bar is float32)."""
    model.prefill_dtype = "float32"
    runner = ModelRunner(model, num_blocks=64, block_size=16, kv_cache_dtype="fp32")
    blocks = tuple(range(1, 1 + (len(prompt) + 15) // 16))
    split = split or len(prompt)
    rows = [runner.execute([SeqChunk(tuple(prompt[:split]), 0, blocks, "all", state_slot=1)])[0]]
    for i in range(split, len(prompt)):
        rows.append(runner.execute([SeqChunk((prompt[i],), i, blocks, "last", state_slot=1)])[0])
    return np.concatenate(rows)


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def tiny(request, tmp_path_factory):
    arch = request.param
    hf = tiny_model(arch)
    folder = tmp_path_factory.mktemp(arch)
    hf.save_pretrained(folder, safe_serialization=True)
    return arch, folder, hf


def test_f32_gguf_in_llama_cpp_layout_matches_transformers(tiny):
    arch, folder, hf = tiny
    ws = open_weights(str(folder))
    path = str(folder / "f32.gguf")
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()})
    gf = open_gguf(path)
    md, cfg = gf.metadata, ws.config
    assert gf.arch == arch
    assert md[f"{arch}.ssm.conv_kernel"] == 4 and md[f"{arch}.ssm.state_size"] == 64
    assert md[f"{arch}.ssm.group_count"] == 2 and md[f"{arch}.ssm.time_step_rank"] == 4
    assert md[f"{arch}.ssm.inner_size"] == 256 and md[f"{arch}.full_attention_interval"] == 4
    assert list(md[f"{arch}.rope.dimension_sections"]) == [11, 11, 10, 0]
    assert md[f"{arch}.rope.dimension_count"] == 16 and md[f"{arch}.rope.freq_base"] == 1e7
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[getattr(gguf.MODEL_ARCH, arch.upper())]}
    for name in gf.tensors:  # every tensor is one llama.cpp's loader knows for this architecture
        base = name.split(".")[2] if name.startswith("blk.") else name.rsplit(".", 1)[0]
        assert f"blk.{{bid}}.{base}" in known or base in known, name
    H, C = cfg.hidden_size, 2 * 2 * 64 + 4 * 64
    shapes = {n: gf.tensors[n].shape for n in gf.tensors}
    assert shapes["blk.0.ssm_conv1d.weight"] == (C, 4) and shapes["blk.0.ssm_a"] == (4,)
    assert shapes["blk.3.attn_q.weight"] == (2 * 4 * 64, H) and "blk.3.attn_qkv.weight" not in shapes
    assert all(gf.tensors[n].ggml_type == Q.F32 for n in ("blk.0.ssm_conv1d.weight", "blk.0.ssm_a"))
    model, cfg2 = load_model(path)
    assert cfg2.linear_layers == (0, 1, 2) and cfg2.ssm_v_head_dim == 64
    ref = hf_logits(hf, LONG).numpy()
    assert rel_err(run(model, LONG), ref) < 2e-3
    assert rel_err(run(model, LONG, split=70), ref) < 2e-3


def test_gguf_values_follow_llama_cpp_conventions(tiny):
    """ssm_a = -exp(A_log), norms + 1 except ssm_norm, value heads tiled (head j reads key head j % Hk)."""
    arch, folder, hf = tiny
    ws, sd = open_weights(str(folder)), hf.state_dict()
    f32 = lambda n: np.asarray(ws.raw(n), np.float32)  # noqa: E731
    p = "model.layers.0."
    np.testing.assert_allclose(f32("blk.0.ssm_a"), _tiled(-np.exp(sd[p + "linear_attn.A_log"].numpy()), 1), rtol=1e-6)
    np.testing.assert_array_equal(f32("blk.0.ssm_norm.weight"), sd[p + "linear_attn.norm.weight"].numpy())
    np.testing.assert_array_equal(f32("blk.0.attn_norm.weight"), sd[p + "input_layernorm.weight"].numpy() + 1)
    z = sd[p + "linear_attn.in_proj_z.weight"].numpy()
    np.testing.assert_array_equal(f32("blk.0.attn_gate.weight"), _tiled(z, 64))
    out = sd[p + "linear_attn.out_proj.weight"].numpy()
    np.testing.assert_array_equal(f32("blk.0.ssm_out.weight"), _tiled(out.T, 64).T)


def test_one_cache_declaration_per_layer(tiny):
    """kv_layout says what each layer keeps: states (conv inputs, S) in the DeltaNet layers, K and V in the attention
    layer; the runner allocates exactly that, the pool counts blocks of the attention layer only, the RAM tier would
    see only it."""
    arch, folder, hf = tiny
    model, cfg = load_model(str(folder))
    C, kv = 2 * 2 * 64 + 4 * 64, LayerKV(cfg.num_kv_heads, cfg.head_dim)
    assert model.kv_layout == (LayerState(((3, C), (4, 64, 64))),) * 3 + (kv,)
    runner = ModelRunner(model, num_blocks=5, block_size=4, kv_cache_dtype="fp16", num_state_slots=3)
    assert [(a.shape, a.dtype) for a in runner.kv_caches[0]] == [((3, 3, C), np.float32), ((3, 4, 64, 64), np.float32)]
    assert [(a.shape, a.dtype) for a in runner.kv_caches[3]] == [((5, 4, cfg.num_kv_heads, cfg.head_dim), np.float16)] * 2
    assert runner.state_layers == [0, 1, 2]
    assert ModelRunner.kv_bytes_per_block(cfg, 4, "fp16") == kv.bytes_per_block(4, "fp16")
    assert layout_state_bytes(model.kv_layout) == 3 * (3 * C + 4 * 64 * 64) * 4
    assert list(paged_caches(model.kv_layout, runner.kv_caches)) == [3]


def _tiled(a, hdim, Hk=2, r=2):
    """Rows from HF's grouped value heads (k0v0, k0v1, k1v0, k1v1) to GGUF's tiled ones (k0v0, k1v0, k0v1, k1v1)."""
    return a.reshape(Hk, r, hdim, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_full_checkpoint_loads_its_text_model_and_says_what_it_skips(arch, tmp_path, caplog):
    text = tiny_config(arch).to_dict()
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=256)
    cls, cfg_cls = ((transformers.Qwen3_5ForConditionalGeneration, transformers.Qwen3_5Config) if arch == "qwen35"
                    else (transformers.Qwen3_5MoeForConditionalGeneration, transformers.Qwen3_5MoeConfig))
    torch.manual_seed(0)
    cfg = cfg_cls(text_config=text, vision_config=vision)
    cfg.text_config._attn_implementation = "eager"
    hf = randomize(cls(cfg).float(), arch)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == cfg.model_type
    with caplog.at_level(logging.INFO, logger="ramlm.model"):
        model, mcfg = load_model(str(tmp_path))
    assert mcfg.arch == arch and "model.visual" in caplog.text
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([LONG[:40]])).logits[0].float().numpy()
    assert rel_err(run(model, LONG[:40], split=20), ref) < 2e-3


def test_mtp_layer_is_kept_in_hf_and_gguf(tmp_path):
    """mtp.* tensors (which transformers does not load) map to layer L's nextn.* tensors and its full-attention layer;
    their norms get + 1; the GGUF counts the layer in block_count and nextn_predict_layers; the decoder runs L layers."""
    arch = "qwen35"
    hf = tiny_model(arch)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    sd, H = hf.state_dict(), hf.config.hidden_size
    g = torch.Generator().manual_seed(5)
    mtp = {"mtp.fc.weight": torch.randn(H, 2 * H, generator=g), "mtp.norm.weight": torch.randn(H, generator=g),
           "mtp.pre_fc_norm_embedding.weight": torch.randn(H, generator=g),
           "mtp.pre_fc_norm_hidden.weight": torch.randn(H, generator=g)}
    for k, v in sd.items():  # layer 3 is full attention: the MTP layer has that shape
        if k.startswith("model.layers.3."):
            mtp["mtp.layers.0." + k[len("model.layers.3."):]] = v.clone()
    save_file(mtp, str(tmp_path / "mtp.safetensors"))
    main = tmp_path / "model.safetensors"
    main.rename(tmp_path / "main.safetensors")
    weight_map = {k: "main.safetensors" for k in sd} | {k: "mtp.safetensors" for k in mtp}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ws = open_weights(str(tmp_path))
    assert ws.config.num_layers == 4 and ws.config.nextn_layers == 1
    np.testing.assert_array_equal(np.asarray(ws.raw("blk.4.nextn.eh_proj.weight")), mtp["mtp.fc.weight"].numpy())
    np.testing.assert_array_equal(np.asarray(ws.raw("blk.4.nextn.enorm.weight")),
                                  mtp["mtp.pre_fc_norm_embedding.weight"].numpy() + 1)
    assert "blk.4.nextn.hnorm.weight" in ws.names() and "blk.4.nextn.shared_head_norm.weight" in ws.names()
    assert "blk.4.attn_q.weight" in ws.names() and "blk.4.post_attention_norm.weight" in ws.names()
    path = str(tmp_path / "mtp.gguf")
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()})
    md = open_gguf(path).metadata
    assert md["qwen35.block_count"] == 5 and md["qwen35.nextn_predict_layers"] == 1
    model, cfg = load_model(path)
    assert cfg.num_layers == 4 and cfg.nextn_layers == 1 and len(model.blocks) == 4
    assert rel_err(run(model, LONG[:20]), hf_logits(hf, LONG[:20]).numpy()) < 2e-3
