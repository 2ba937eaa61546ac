"""FP8 HF checkpoints (quant_method fp8 block-wise, compressed-tensors float-quantized) against transformers running
the float values the checkpoint decodes to; malformed ones refused by name."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

from engine.errors import ModelLoadError
from engine.model.hf_quant_writer import write_quantized_folder
from engine.model.info import model_info
from engine.model.loader import load_model
from engine.model.weights import open_weights
from tests.model.quant_folders import edited_copy, reference_folder
from tests.model.test_architectures import PROMPTS, rel_err, run_batched, run_incremental
from tests.model.tiny_models import hf_logits, tiny_model

# qwen35moe: FP8 linear-attention projections (reordered by rows at load, held as float32); deepseek2: kv_b_proj
# split across scale blocks (float32 too), q_b_proj's 64-wide rows left in float by the writer
CASES = [("llama", "fp8-block"), ("qwen3", "fp8-block"), ("qwen3moe", "fp8-block"), ("qwen3", "ct-channel"),
         ("qwen3moe", "ct-tensor"), ("llama", "ct-block"), ("qwen35moe", "fp8-block"), ("deepseek2", "fp8-block")]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def fp8_folder(request, tmp_path_factory):
    arch, scheme = request.param
    root = tmp_path_factory.mktemp(f"fp8-{arch}-{scheme}")
    src, dst = str(root / "float"), str(root / "fp8")
    # qwen3.5: value heads of 128 (as the real models) so that ssm_out's reorder moves whole FP8 blocks
    extra = {"linear_value_head_dim": 128} if arch == "qwen35moe" else {}
    tiny_model(arch, **extra).save_pretrained(src, safe_serialization=True)
    decoded = write_quantized_folder(src, dst, scheme, scale_dtype=torch.bfloat16 if scheme == "ct-channel" else None)
    ref = transformers.AutoModelForCausalLM.from_pretrained(reference_folder(src, str(root / "ref"), decoded),
                                                            dtype=torch.float32, attn_implementation="eager").eval()
    return arch, scheme, dst, [hf_logits(ref, p).numpy() for p in PROMPTS]


def test_fp8_folder_holds_fp8_weights(fp8_folder):
    arch, scheme, path, _ = fp8_folder
    types = model_info(path)["tensor_types"]
    assert "FP8_E4M3" in types, types
    if arch != "deepseek2":  # (its tiny float32 embeddings and kv_b split outweigh the rest)
        assert next(iter(types)) == "FP8_E4M3", types  # the bulk of the bytes stay 8-bit
    ws = open_weights(path)
    last = ws.config.num_layers - 1  # a full-attention layer in every case (qwen3.5's fourth)
    assert ws.info(f"blk.{last}.attn_output.weight").ggml_type.name == "FP8_E4M3"
    if arch == "qwen35moe":  # the linear-attention projections' value-head reorders move FP8 rows and blocks
        for name in ("attn_qkv", "attn_gate", "ssm_out", "ssm_alpha", "ssm_beta"):
            assert ws.info(f"blk.0.{name}.weight").ggml_type.name == "FP8_E4M3", name
    tensors = load_file(os.path.join(path, "model.safetensors"))
    assert any(t.dtype == torch.float8_e4m3fn for t in tensors.values())


def test_fp8_matches_transformers_on_decoded_weights(fp8_folder):
    arch, scheme, path, refs = fp8_folder
    model, _ = load_model(path)
    for got, ref in zip(run_batched(model, PROMPTS), refs):
        assert rel_err(got, ref) < 2e-3, (arch, scheme, rel_err(got, ref))
    got = run_incremental(model, PROMPTS[0], 6)
    assert rel_err(got, refs[0]) < 2e-3, (arch, scheme, rel_err(got, refs[0]))


@pytest.fixture(scope="module")
def block_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8-errors")
    tiny_model("qwen3").save_pretrained(str(root / "float"), safe_serialization=True)
    write_quantized_folder(str(root / "float"), str(root / "fp8"))
    return str(root / "fp8")


def test_missing_scale_is_named(block_folder, tmp_path):
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"
    with pytest.raises(ModelLoadError, match="model.layers.1.mlp.down_proj.weight.*missing scale tensor"):
        load_model(edited_copy(block_folder, tmp_path, tensors=lambda t: t.pop(name)))


@pytest.mark.parametrize("edit, message", [
    (lambda qc: {**qc, "weight_block_size": [128]}, "weight_block_size must be two positive integers"),
    (lambda qc: {**qc, "weight_block_size": [128, 64]}, "not a multiple of 128"),
    (lambda qc: {**qc, "weight_block_size": [64, 128]}, "does not fit weight"),
    (lambda qc: {**qc, "fmt": "e5m2"}, "fp8 fmt 'e5m2' is not supported"),
    (lambda qc: {"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not supported yet"),
    (lambda qc: "fp8", "not a JSON object"),
])
def test_malformed_quantization_config_is_refused(block_folder, tmp_path, edit, message):
    with pytest.raises(ModelLoadError, match=message):
        load_model(edited_copy(block_folder, tmp_path, config=edit))


def test_float8_without_quantization_config_is_refused(block_folder, tmp_path):
    path = edited_copy(block_folder, tmp_path)
    cfg = json.loads(open(os.path.join(path, "config.json")).read())
    del cfg["quantization_config"]
    open(os.path.join(path, "config.json"), "w").write(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="float8 weights in a folder whose config.json has no FP8 quantization_conf"):
        load_model(path)


def test_fp8_dequantizes_to_the_checkpoint_values(block_folder):
    """The loaded q_proj of layer 0 holds exactly e4m3 * scale_inv (block 128 x 128)."""
    model, cfg = load_model(block_folder)
    t = load_file(os.path.join(block_folder, "model.safetensors"))
    q = t["model.layers.0.self_attn.q_proj.weight"].to(torch.float32).numpy()
    s = t["model.layers.0.self_attn.q_proj.weight_scale_inv"].numpy()
    want = q * np.repeat(np.repeat(s, 128, 0), 128, 1)[:q.shape[0], :q.shape[1]]
    ws = model.weights
    from cpu_kernels.quant import QuantLinear
    info = ws.info("blk.0.attn_q.weight")
    lin = QuantLinear.from_raw(info.ggml_type, ws.raw("blk.0.attn_q.weight"), info.shape)
    np.testing.assert_array_equal(lin.dequantize(), want.astype(np.float32))


@pytest.mark.parametrize("weight_dtype", ["packed", "float32"])
def test_fp8_layers_on_the_device_path(block_folder, weight_dtype):
    """FP8 layers placed on a device (torch's CPU device here): packed, they stay FP8 rows dequantized per matmul
    by torch's float8 cast; both give the CPU path's logits."""
    from tests.offload.helpers import batched, cpu_runner, placed
    want = batched(cpu_runner(block_folder))
    model, runner, p, _ = placed(block_folder, n_gpu_layers="all", gpu_weight_dtype=weight_dtype)
    for got, ref in zip(batched(runner), want):
        assert rel_err(got, ref) < 1e-4, rel_err(got, ref)
