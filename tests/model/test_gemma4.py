"""Gemma 4 beyond the registry walk (test_architectures / test_block_paths run both tiny models): the GGUF keys and
tensors llama.cpp's gemma4 loader reads, the per-layer caches (KV-shared layers hold none and are counted so), a full
multimodal `gemma4` checkpoint loading its text model, and what is refused."""
from __future__ import annotations

import logging

import gguf
import numpy as np
import pytest
import torch
import transformers

from engine.core.kv_spec import LayerKV
from engine.errors import ModelLoadError
from engine.model.gguf import open_gguf
from engine.model.gguf_export import default_qtype, write_gguf
from engine.model.info import format_info, model_info
from engine.model.loader import load_model
from engine.model.weights import open_weights
from engine.worker.runner import ModelRunner
from tests.model.test_architectures import PROMPTS, rel_err, run_batched, run_incremental
from tests.model.tiny_models import tiny_config, tiny_model

Q = gguf.GGMLQuantizationType


def _save(model, folder) -> str:
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


def _export(folder, path, qtype=None) -> str:
    ws = open_weights(folder)
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()}, qtype)
    return path


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """The PLE / KV-sharing model's HF folder."""
    return _save(tiny_model("gemma4"), tmp_path_factory.mktemp("gemma4"))


def test_gguf_holds_llama_cpp_keys_and_tensors(dense, tmp_path):
    gf = open_gguf(_export(dense, str(tmp_path / "q8.gguf"), default_qtype(Q.Q8_0)))
    md = {k.removeprefix("gemma4."): v for k, v in gf.metadata.items() if k.startswith("gemma4.")}
    want = {"attention.key_length": 64, "attention.value_length": 64, "attention.key_length_swa": 32,
            "attention.value_length_swa": 32, "rope.dimension_count": 64, "rope.dimension_count_swa": 32,
            "attention.sliding_window": 5, "attention.shared_kv_layers": 2, "embedding_length_per_layer_input": 32,
            "attention.head_count": 4, "block_count": 6}
    assert {k: md[k] for k in want} == want
    assert md["rope.freq_base"] == pytest.approx(1e6) and md["rope.freq_base_swa"] == pytest.approx(1e4)
    assert md["final_logit_softcapping"] == pytest.approx(30.0)
    assert list(md["attention.sliding_window_pattern"]) == [True, True, True, False, True, False]
    assert list(md["attention.head_count_kv"]) == [2, 2, 2, 1, 2, 1]   # full layers: num_global_key_value_heads
    assert list(md["feed_forward_length"]) == [512] * 4 + [1024] * 2  # double-wide MLP on the KV-shared layers
    names = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GEMMA4]}
    for n in gf.tensors:  # every tensor is one llama.cpp's gemma4 loader names
        base = n.split(".")[2] if n.startswith("blk.") else n.rsplit(".", 1)[0]
        assert any(t.split(".")[-1] == base for t in names), n
    t = gf.tensors
    assert "blk.3.attn_k.weight" in t and "blk.3.attn_v.weight" not in t      # k_eq_v: V is K's projection
    assert "blk.2.attn_v.weight" in t                                          # sliding layers keep theirs
    assert not any(f"blk.{i}.attn_{p}" in n for i in (4, 5) for p in ("k.", "v.", "k_norm") for n in t)  # KV-shared
    assert t["blk.3.attn_k.weight"].shape == (64, 256) and t["blk.0.attn_k.weight"].shape == (64, 256)
    assert t["per_layer_token_embd.weight"].shape == (256, 6 * 32)
    assert t["per_layer_model_proj.weight"].shape == (6 * 32, 256)
    assert t["blk.0.layer_output_scale.weight"].shape == (1,)
    # proportional RoPE as llama.cpp holds it: int(0.25 * 64 / 2) = 8 turning pairs, the rest 1e30 (no rotation)
    np.testing.assert_array_equal(gf.raw("rope_freqs.weight"), np.array([1.0] * 8 + [1e30] * 24, np.float32))


def test_moe_gguf_keeps_llama_cpps_expert_layout(tmp_path):
    folder = _save(tiny_model("gemma4-moe"), tmp_path / "hf")
    gf = open_gguf(_export(folder, str(tmp_path / "moe.gguf")))
    t, md = gf.tensors, gf.metadata
    assert t["blk.0.ffn_gate_up_exps.weight"].shape == (8, 2 * 128, 256)  # gate rows first, then up (kept fused)
    assert t["blk.0.ffn_down_exps.weight"].shape == (8, 256, 128)
    assert t["blk.0.ffn_down_exps.scale"].shape == (8,) and t["blk.0.ffn_gate_inp.scale"].shape == (256,)
    for n in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2", "ffn_gate", "ffn_up", "ffn_down"):
        assert f"blk.1.{n}.weight" in t, n
    assert (md["gemma4.expert_count"], md["gemma4.expert_used_count"]) == (8, 2)
    assert md["gemma4.expert_feed_forward_length"] == 128


def test_block_spec_tensors_are_the_exported_ones(dense, tmp_path):
    """Synthetic files and the planner's shapes come from the BlockSpecs: the very names and shapes of a file
    exported from an HF checkpoint (rope_freqs included)."""
    from engine.model.tensors import tensor_shapes
    for arch, folder in (("gemma4", dense), ("gemma4-moe", _save(tiny_model("gemma4-moe"), tmp_path / "moe"))):
        gf = open_gguf(_export(folder, str(tmp_path / f"{arch}.gguf")))
        ws = open_weights(folder)
        want = {n: tuple(gf.tensors[n].shape) for n in gf.tensors if n != "output.weight"}
        assert tensor_shapes(ws.config) == want, arch


def test_kv_shared_layers_hold_no_cache_and_are_counted_so(dense):
    model, cfg = load_model(dense)
    sliding, full = LayerKV(2, 32, window=5), LayerKV(1, 64)  # a shared layer slides as its source (one group)
    assert model.kv_layout == (sliding, sliding, sliding, full, LayerKV(2, 32, shared_from=2, window=5),
                               LayerKV(1, 64, shared_from=3))
    runner = ModelRunner(model, num_blocks=5, block_size=16, kv_cache_dtype="auto")
    assert runner.kv_caches[4] is runner.kv_caches[2] and runner.kv_caches[5] is runner.kv_caches[3]
    assert runner.kv_caches[3][0].shape == (5, 16, 1, 64) and runner.kv_caches[0][0].shape == (5, 16, 2, 32)
    assert runner.kv_caches[3][0] is not runner.kv_caches[3][1]  # k_eq_v still caches V (normed, not roped)
    per_block = 16 * 2 * 2 * (3 * 2 * 32 + 1 * 64)  # fp16 K and V of the four layers that own a cache
    assert ModelRunner.kv_bytes_per_block(cfg, 16) == per_block
    info = model_info(dense)
    assert info["kv_bytes_per_1k_tokens"] == 1024 * 2 * 2 * 64 and info["kv_shared_layers"] == 2  # the full layer's
    assert info["kv_sliding_bytes_per_sequence"] == 3 * 5 * 2 * 2 * 2 * 32  # three sliding layers' 5-token windows
    text = format_info(info)
    assert "2 layers read the K/V of earlier layers and hold none" in text
    assert "full layers: 1 kv heads, head_dim 64" in text
    from offload import model_meta
    meta = model_meta(model.weights)
    assert [meta.has_kv(i) for i in range(6)] == [True] * 4 + [False] * 2  # the planner counts 4 layers' blocks


def test_planner_counts_each_layer_at_its_own_size():
    """gemma-4-26b-a4b's shape: 25 sliding layers of 8 x 256 and 5 full ones of 2 x 512 (K only: attention_k_eq_v),
    each with its own cache: the planner's KV bytes for a pool are those the runner allocates for it (each layer at
    its own size), not every layer at the largest."""
    from engine.core.kv_spec import layout_bytes_per_block
    from offload.devices import probe_devices
    from offload.meta import synthetic_meta
    from offload.plan_types import PlanOptions
    from offload.sizes import SizeModel
    meta = synthetic_meta("gemma4-26b-a4b", "q4_k_m")
    assert all(meta.has_kv(i) for i in range(30)) and (meta.kv.num_heads, meta.kv.head_dim) == (8, 256)
    sizes = SizeModel(meta, probe_devices(gpus=False), PlanOptions(block_size=16, kv_cache_dtype="fp16",
                                                          num_gpu_blocks_override=100))  # no window caps
    per_block = layout_bytes_per_block(meta.kv_layout, 16, "fp16")
    assert sizes.kv_bytes(100, range(30)) == 100 * per_block
    assert per_block < 30 * meta.kv.bytes_per_block(16, "fp16")


def _multimodal(tmp_path):
    """A full Gemma4ForConditionalGeneration (text model of tiny_model("gemma4"), a one-layer vision tower)."""
    text = tiny_model("gemma4")
    vision = transformers.Gemma4VisionConfig(hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                             num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    cfg = transformers.Gemma4Config(text_config=tiny_config("gemma4").to_dict(), vision_config=vision.to_dict(),
                                    audio_config=None)
    cfg._attn_implementation = "eager"
    mm = transformers.Gemma4ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        mm.model.language_model.load_state_dict(text.model.state_dict())
    return _save(mm, tmp_path / "mm"), mm


def test_full_checkpoint_loads_its_text_model_and_says_what_it_skips(tmp_path, caplog):
    folder, mm = _multimodal(tmp_path)
    with caplog.at_level(logging.INFO, logger="ramlm.model"):
        model, cfg = load_model(folder)
    assert cfg.arch == "gemma4" and cfg.per_layer_input_size == 32 and cfg.kv_shared_layers == 2
    logged = [r.getMessage() for r in caplog.records]
    assert any("skipping its vision" in msg for msg in logged), logged
    with torch.no_grad():
        refs = [mm(input_ids=torch.tensor([p])).logits[0].float().numpy() for p in PROMPTS]
    for got, ref in zip(run_batched(model, PROMPTS), refs):
        assert rel_err(got, ref) < 2e-3
    assert rel_err(run_incremental(model, PROMPTS[0], 4), refs[0]) < 2e-3


def test_bidirectional_attention_is_refused(tmp_path):
    cfg = tiny_config("gemma4-moe")
    cfg.use_bidirectional_attention = "all"
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(ModelLoadError, match="use_bidirectional_attention"):
        load_model(_save(model, tmp_path / "bidi"))


def test_a_cpu_reader_of_a_device_kv_cache_is_refused(dense):
    """Layer 4 reads layer 2's cache: a GPU layer may read it from RAM (host attention), a CPU layer cannot read
    a device cache."""
    from offload.apply import _check_shared_kv
    from offload.plan_types import LayerPlan
    model, _ = load_model(dense)

    def plan(gpu):
        return [LayerPlan(i, "cuda:0" if i in gpu else "cpu", "device", "packed", "cuda:0" if i in gpu else "cpu")
                for i in range(6)]
    _check_shared_kv(plan({4, 5}), model.kv_layout)        # the last layers on the GPU (llama.cpp's order)
    _check_shared_kv(plan(set(range(6))), model.kv_layout)
    with pytest.raises(ValueError, match="layer 4 reads layer 2's KV cache"):
        _check_shared_kv(plan({2, 3}), model.kv_layout)


def test_gpu_kv_shared_layers_over_sources_in_ram_match_the_kernels(dense):
    """n_gpu_layers 2: the KV-shared layers 4 and 5 run as torch twins (torch's CPU device) over the numpy caches
    their sources (CPU layers 2 and 3) write."""
    from tests.model.test_block_paths import _decode
    from tests.offload.helpers import placed
    model, _ = load_model(dense)
    plain = _decode(ModelRunner(model, num_blocks=12, block_size=4, kv_cache_dtype="fp32"))
    model, runner, plan, _ = placed(dense, n_gpu_layers=2)
    assert plan.gpu_layers() == [4, 5]
    assert rel_err(_decode(runner), plain) < 1e-4


def test_synthetic_gemma4_file_loads_and_decodes(tmp_path):
    """bench/make_synthetic's tiny-gemma4 (every feature at once): the file's tensors are the BlockSpecs', rope_freqs
    holds proportional RoPE's values, and it loads and decodes."""
    from bench.make_synthetic import write_synthetic
    from engine.worker.runner import SeqChunk
    path = str(tmp_path / "tiny-gemma4.gguf")
    write_synthetic(path, "tiny-gemma4", "q4_k_m")
    gf = open_gguf(path)
    np.testing.assert_array_equal(gf.raw("rope_freqs.weight"), np.array([1.0] * 16 + [1e30] * 48, np.float32))
    assert gf.tensors["blk.5.ffn_gate.weight"].shape[0] == 1024 and "blk.5.attn_k.weight" not in gf.tensors
    model, cfg = load_model(path)
    assert (cfg.rope_pairs_global, cfg.kv_shared_layers, cfg.double_wide_mlp) == (16, 2, True)
    assert cfg.attn_k_eq_v and cfg.num_experts == 8 and cfg.per_layer_input_size == 32
    runner = ModelRunner(model, num_blocks=6, block_size=16)
    out = runner.execute([SeqChunk(tuple(range(5, 30)), 0, (1, 2), "all")])[0]
    out = np.concatenate([out, runner.execute([SeqChunk((7,), 25, (1, 2), "last")])[0]])
    assert out.shape == (26, cfg.vocab_size) and np.isfinite(out).all()


@pytest.mark.parametrize("key,value,what", [
    ("attention.head_count_kv", [2, 1, 2, 1, 2, 1], "varies within a layer type"),
    ("feed_forward_length", [512, 768, 512, 512, 1024, 1024], "neither one width nor the double-wide"),
    ("attention.value_length", 32, "value_length or rope.dimension_count != key_length")])
def test_gguf_layouts_it_cannot_run_are_refused(dense, tmp_path, monkeypatch, key, value, what):
    from engine.model.archs.gemma4 import Gemma4
    own = Gemma4.gguf_metadata
    monkeypatch.setattr(Gemma4, "gguf_metadata", lambda self, cfg: {**own(self, cfg), key: value})
    path = _export(dense, str(tmp_path / "odd.gguf"))
    with pytest.raises(ModelLoadError, match=what):
        load_model(path)


@pytest.mark.parametrize("arch", ["gemma4", "gemma4-moe"])
def test_bf16_checkpoint_matches_transformers_on_its_weights(arch, tmp_path):
    """Released checkpoints are bf16: the vectors without .weight (layer_scalar, router.scale, per_expert_scale)
    and the stacked experts are read from bf16 too."""
    hf = tiny_model(arch)
    folder = _save(hf.to(torch.bfloat16), tmp_path / "bf16")
    hf = hf.to(torch.float32)  # the bf16-rounded weights, computed in float32 as ramlm does
    model, _ = load_model(folder)
    assert model.weights.info("blk.0.layer_output_scale.weight").ggml_type == Q.BF16
    with torch.no_grad():
        refs = [hf(torch.tensor([p])).logits[0].numpy() for p in PROMPTS]
    for got, ref in zip(run_batched(model, PROMPTS), refs):
        assert rel_err(got, ref) < 2e-3, arch
