"""DeepSeek-V3 shapes beyond the registry walk (test_architectures / test_block_paths run the q_lora model): plain q
(q_lora_rank None, the smaller models), legacy GGUFs holding the unsplit attn_kv_b, YaRN with mscale != mscale_all_dim,
the GGUF keys and tensors llama.cpp reads, and the latent cache (one array per layer, counted as such)."""
from __future__ import annotations

import copy

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from engine.core.kv_spec import LayerKV
from engine.model.gguf import open_gguf
from engine.model.gguf_export import _add_kv, default_qtype, gguf_metadata, write_gguf
from engine.model.info import format_info, model_info
from engine.model.loader import load_model
from engine.model.weights import open_weights
from engine.worker.runner import ModelRunner
from tests.model.test_architectures import PROMPTS, rel_err, run_batched, run_incremental
from tests.model.tiny_models import hf_logits, tiny_config, tiny_model

Q = gguf.GGMLQuantizationType


def _save(model, folder) -> str:
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


@pytest.fixture(scope="module")
def lite(tmp_path_factory):
    """The q_lora_rank None model: (HF folder, transformers' logits of PROMPTS, the model)."""
    hf = tiny_model("deepseek2-lite")
    folder = _save(hf, tmp_path_factory.mktemp("lite"))
    return folder, [hf_logits(hf, p).numpy() for p in PROMPTS], hf


def test_plain_q_folder_matches_transformers_batched_and_through_the_cache(lite):
    folder, refs, _ = lite
    model, cfg = load_model(folder)
    assert cfg.q_lora_rank == 0 and "blk.0.attn_q.weight" in model.weights
    for got, ref in zip(run_batched(model, PROMPTS), refs):
        assert rel_err(got, ref) < 2e-3
    assert rel_err(run_incremental(model, PROMPTS[0], 5), refs[0]) < 2e-3
    assert rel_err(run_incremental(model, PROMPTS[0], 3, kv="fp16", block_size=16), refs[0]) < 1e-2


@pytest.mark.parametrize("quant", [Q.Q8_0, Q.Q4_K])
def test_plain_q_gguf_matches_transformers_on_dequantized_weights(lite, quant, tmp_path):
    """Within 5e-2 with no row exempt: the correction bias is spread wide here, so that the quantized activations cannot flip
    an expert (this tiny router has near ties on a fifth of its rows, which flip under Q4_K)."""
    from cpu_kernels.quant.quantize import quantize
    _, _, hf = lite
    block = gguf.GGML_QUANT_SIZES[quant][0]
    ref_model = copy.deepcopy(hf)
    with torch.no_grad():  # both sides hold the format's values (kv_b's rows are attn_k_b/v_b's, split)
        for name, b in ref_model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.arange(b.numel(), dtype=torch.float32))
        for name, p in ref_model.named_parameters():
            if p.ndim >= 2 and p.shape[-1] % block == 0 and not name.endswith("mlp.gate.weight") \
                    and "kv_b_proj" not in name:
                deq = gguf.quants.dequantize(quantize(quant, p.numpy().reshape(-1, p.shape[-1])), quant)
                p.copy_(torch.from_numpy(np.ascontiguousarray(deq, dtype=np.float32)).reshape(p.shape))
    ws = open_weights(_save(ref_model, tmp_path / "roundtrip"))
    path = str(tmp_path / "lite.gguf")
    pick = default_qtype(quant)
    # attn_k_b / attn_v_b stay float: transformers holds kv_b_proj unsplit, so their quantized rows have no HF twin
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()},
               lambda n, s: Q.F32 if "attn_k_b" in n or "attn_v_b" in n else pick(n, s))
    model, cfg = load_model(path)
    assert cfg.arch == "deepseek2" and cfg.q_lora_rank == 0
    refs = [hf_logits(ref_model, p).numpy() for p in PROMPTS]
    for got, ref in zip(run_batched(model, PROMPTS) + [run_incremental(model, PROMPTS[0], 5)], refs + refs[:1]):
        assert rel_err(got, ref) < 5e-2  # as assert_quantized_close holds the dense architectures


def _legacy_gguf(folder: str, path: str) -> None:
    """The layout of GGUFs converted before llama.cpp split kv_b: attn_kv_b whole, key/value_length the real head
    dims, head_count_kv the heads, no *_mla keys."""
    ws = open_weights(folder)
    cfg = ws.config
    tensors = {n: np.asarray(ws.raw(n), np.float32) for n in ws.names() if "attn_k_b" not in n and "attn_v_b" not in n}
    st = load_file(f"{folder}/model.safetensors")  # kv_b_proj as transformers saved it
    for i in range(cfg.num_layers):
        tensors[f"blk.{i}.attn_kv_b.weight"] = st[f"model.layers.{i}.self_attn.kv_b_proj.weight"].astype(np.float32)
    md = gguf_metadata(cfg)
    a = cfg.arch
    for k in ("attention.key_length_mla", "attention.value_length_mla"):
        md.pop(f"{a}.{k}")
    md.update({f"{a}.attention.key_length": cfg.head_dim, f"{a}.attention.value_length": cfg.value_head_dim,
               f"{a}.attention.head_count_kv": cfg.num_heads})
    w = gguf.GGUFWriter(path, a)
    for k, v in md.items():
        _add_kv(w, k, v)
    for name, t in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_legacy_gguf_with_unsplit_kv_b_is_split_at_load(lite, tmp_path):
    folder, refs, _ = lite
    path = str(tmp_path / "legacy.gguf")
    _legacy_gguf(folder, path)
    gf = open_gguf(path)
    assert "blk.0.attn_kv_b.weight" in gf.tensors and "blk.0.attn_k_b.weight" not in gf.tensors
    model, cfg = load_model(path)
    assert (cfg.head_dim, cfg.value_head_dim, cfg.num_kv_heads) == (48, 64, 1)
    for got, ref in zip(run_batched(model, PROMPTS), refs):
        assert rel_err(got, ref) < 2e-3


def test_yarn_mscale_apart_from_mscale_all_dim_matches_transformers(tmp_path):
    """HF's cos/sin factor is then mscale's yarn factor over mscale_all_dim's, and the softmax scale carries
    mscale_all_dim's squared: neither is 1."""
    cfg = tiny_config("deepseek2")
    cfg.rope_parameters = dict(cfg.rope_parameters, mscale=1.0, mscale_all_dim=0.5)
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    hf = tiny_model("deepseek2")
    other = type(hf)(cfg).eval()
    other.load_state_dict(hf.state_dict())
    folder = _save(other, tmp_path / "mscale")
    model, c = load_model(folder)
    assert abs(c.rope_yarn_log_mul - 0.05) < 1e-9 and c.rope_scaling.attn_factor != 1.0
    ref = hf_logits(other, PROMPTS[0]).numpy()
    assert rel_err(run_incremental(model, PROMPTS[0], 4), ref) < 2e-3


def test_gguf_holds_llama_cpp_keys_and_tensors(tmp_path):
    hf = tiny_model("deepseek2")
    ws = open_weights(_save(hf, tmp_path / "hf"))
    path = str(tmp_path / "q8.gguf")
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()}, default_qtype(Q.Q8_0))
    gf = open_gguf(path)
    md = gf.metadata
    want = {"attention.head_count_kv": 1, "attention.key_length": 256 + 16, "attention.value_length": 256,
            "attention.key_length_mla": 48, "attention.value_length_mla": 64, "attention.q_lora_rank": 64,
            "attention.kv_lora_rank": 256, "rope.dimension_count": 16, "leading_dense_block_count": 1,
            "expert_shared_count": 1, "expert_group_count": 4, "expert_group_used_count": 2,
            "expert_gating_func": 2, "expert_weights_norm": True, "rope.scaling.type": "yarn"}
    assert {k: md[f"deepseek2.{k}"] for k in want} == want
    assert md["deepseek2.expert_weights_scale"] == pytest.approx(2.5)
    assert md["deepseek2.rope.scaling.yarn_log_multiplier"] == pytest.approx(0.0707)  # 0.1 x mscale_all_dim
    # Every tensor is one llama.cpp's deepseek2 loader names, with its ggml shape (ne: numpy order reversed).
    names = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.DEEPSEEK2]}
    for n in gf.tensors:
        base = n.split(".")[2] if n.startswith("blk.") else n.rsplit(".", 1)[0]
        assert any(t.split(".")[-1] == base for t in names), n
    assert gf.tensors["blk.1.attn_k_b.weight"].shape == (4, 256, 32)    # ne {nope, kv_lora, heads}
    assert gf.tensors["blk.1.attn_v_b.weight"].shape == (4, 64, 256)    # ne {kv_lora, v, heads}
    assert gf.tensors["blk.1.attn_kv_a_mqa.weight"].shape == (256 + 16, 256)
    assert gf.tensors["blk.1.ffn_gate_exps.weight"].shape == (8, 128, 256)
    assert "blk.1.exp_probs_b.bias" in gf.tensors and "blk.0.ffn_gate.weight" in gf.tensors
    kvb = ws.raw("blk.1.attn_k_b.weight")  # HF kv_b_proj rows of head 1, nope part, transposed
    st = hf.state_dict()["model.layers.1.self_attn.kv_b_proj.weight"].numpy().reshape(4, 32 + 64, 256)
    np.testing.assert_array_equal(kvb[1], st[1, :32].T)
    np.testing.assert_array_equal(ws.raw("blk.1.attn_v_b.weight")[2], st[2, 32:])


def test_latent_cache_is_one_array_per_layer_and_counted_so(tmp_path):
    folder = _save(tiny_model("deepseek2"), tmp_path / "hf")
    model, cfg = load_model(folder)
    assert model.kv_layout == (LayerKV(1, 272, v_is_k=True),) * 3
    runner = ModelRunner(model, num_blocks=5, block_size=16, kv_cache_dtype="auto")
    for k, v in runner.kv_caches:
        assert k is v and k.shape == (5, 16, 1, 272) and k.dtype == np.float16
    assert ModelRunner.kv_bytes_per_block(cfg, 16) == 3 * 16 * 272 * 2
    info = model_info(folder)
    assert info["kv_bytes_per_1k_tokens"] == 3 * 272 * 2 * 1024
    text = format_info(info)
    assert "MLA, 4 heads of 48 (rope 16), value_dim 64, q_lora_rank 64, kv_lora_rank 256" in text
    assert "latent cache (MLA)" in text
    from offload import model_meta
    from offload.meta import synthetic_meta
    assert model_meta(model.weights).kv == LayerKV(1, 272, v_is_k=True)
    assert synthetic_meta("deepseek-v3-3l").kv == LayerKV(1, 576, v_is_k=True)


def test_block_spec_tensors_are_the_converted_ones(tmp_path):
    """Synthetic files and the planner's shapes come from BlockSpec.tensors: the very names and shapes an HF
    checkpoint converts to."""
    from engine.model.tensors import tensor_shapes
    for arch in ("deepseek2", "deepseek2-lite"):
        ws = open_weights(_save(tiny_model(arch), tmp_path / arch))
        assert tensor_shapes(ws.config) == {n: tuple(ws.info(n).shape) for n in ws.names()}, arch


def test_synthetic_deepseek_file_loads_and_decodes(tmp_path):
    from bench.make_synthetic import write_synthetic
    from engine.worker.runner import SeqChunk
    path = str(tmp_path / "tiny-deepseek.gguf")
    write_synthetic(path, "tiny-deepseek", "q4_k_m")
    gf = open_gguf(path)
    assert gf.tensors["blk.1.attn_k_b.weight"].ggml_type == Q.Q5_0  # 32-wide rows: llama.cpp's Q4_K fallback
    assert gf.tensors["blk.1.attn_v_b.weight"].ggml_type == Q.Q4_K
    model, cfg = load_model(path)
    runner = ModelRunner(model, num_blocks=4, block_size=16)
    out = runner.execute([SeqChunk((5, 6, 7), 0, (1,), "last")])[0]
    assert out.shape == (1, cfg.vocab_size) and np.isfinite(out).all()
