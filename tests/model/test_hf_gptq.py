"""GPTQ (4- and 8-bit, symmetric and asymmetric; AutoGPTQ's layout), AWQ (4-bit gemm, AutoAWQ's layout) and
compressed-tensors int HF checkpoints against transformers running the values the checkpoint decodes to; they load as
the blocks holding the same numbers (Q4_0, Q5_0, Q8_0 for W8A8, ramlm's Q8_A16 and U8_ZP for weight-only 8-bit)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

from engine.errors import ModelLoadError
from engine.model.hf_quant_writer import write_quantized_folder
from engine.model.loader import load_model
from engine.model.weights import open_weights
from tests.model.test_architectures import PROMPTS, assert_quantized_close, rel_err, run_batched, run_incremental
from tests.model.quant_folders import edited_copy, reference_folder
from tests.model.tiny_models import hf_logits, tiny_model

CASES = [("llama", "gptq-4"), ("qwen3moe", "gptq-4"), ("qwen3", "gptq-8"), ("qwen3", "gptq-4-asym"),
         ("llama", "gptq-4-actorder"), ("qwen3moe", "gptq-4-actorder"), ("qwen3", "ct-w4a16-actorder"),
         ("llama", "awq"), ("qwen3moe", "awq"), ("qwen3", "ct-w4a16"), ("qwen3moe", "ct-w4a16-asym"),
         ("llama", "ct-w8a16"), ("qwen3", "ct-w8a8"), ("qwen3moe", "gptq-8-asym"), ("llama", "ct-w8a16-asym")]
TYPE = {"gptq-4": "Q4_0", "gptq-4-actorder": "Q4_0", "gptq-8": "Q8_A16", "gptq-4-asym": "Q5_0", "awq": "Q5_0",
        "ct-w4a16": "Q4_0", "ct-w4a16-actorder": "Q4_0", "ct-w4a16-asym": "Q5_0", "ct-w8a16": "Q8_A16",
        "ct-w8a8": "Q8_0",
        "gptq-8-asym": "U8_ZP", "ct-w8a16-asym": "U8_ZP"}


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def gptq_folder(request, tmp_path_factory):
    arch, scheme = request.param
    root = tmp_path_factory.mktemp(f"{scheme}-{arch}")
    src, dst = str(root / "float"), str(root / "quantized")
    tiny_model(arch).save_pretrained(src, safe_serialization=True)
    decoded = write_quantized_folder(src, dst, scheme)
    ref = transformers.AutoModelForCausalLM.from_pretrained(reference_folder(src, str(root / "ref"), decoded),
                                                            dtype=torch.float32, attn_implementation="eager").eval()
    return arch, scheme, dst, [hf_logits(ref, p).numpy() for p in PROMPTS]


def test_gptq_loads_as_blocks_of_the_same_numbers(gptq_folder):
    arch, scheme, path, _ = gptq_folder
    ws = open_weights(path)
    assert ws.info("blk.1.attn_output.weight").ggml_type.name == TYPE[scheme]
    tensors = load_file(os.path.join(path, "model.safetensors"))
    key = {"ct-w8a8": "weight", "ct-w4a16": "weight_packed", "ct-w4a16-asym": "weight_packed",
           "ct-w4a16-actorder": "weight_packed",
           "ct-w8a16": "weight_packed", "ct-w8a16-asym": "weight_packed"}.get(scheme, "qweight")
    dtype = torch.int8 if scheme == "ct-w8a8" else torch.int32
    assert tensors[f"model.layers.1.self_attn.o_proj.{key}"].dtype == dtype


# Weight-only 8-bit checkpoints: their types keep the activations to 16-bit precision (k_a16.py), so the logits are
# those of the decoded weights within the 2e-3; the other kernels round activations to int8 per 32 values, as
# llama.cpp does (about 0.5 %), W8A8's as vLLM's per-token int8 activations do.
W8A16 = ("gptq-8", "ct-w8a16", "gptq-8-asym", "ct-w8a16-asym")


def test_gptq_matches_transformers_on_decoded_weights(gptq_folder):
    arch, scheme, path, refs = gptq_folder
    model, _ = load_model(path)
    got = run_batched(model, PROMPTS) + [run_incremental(model, PROMPTS[0], 6)]
    if scheme in W8A16:
        errs = [rel_err(g, r) for g, r in zip(got, refs + refs[:1])]
        assert max(errs) < 2e-3, errs
        return
    for g, ref in zip(got, refs + refs[:1]):
        assert_quantized_close(arch, g, ref)


def test_asymmetric_8bit_runs_in_the_fused_decode_step(gptq_folder, monkeypatch):
    """U8_ZP weights (and experts) run inside the compiled decode step, bitwise what the kernels give one by one."""
    from tests.model.test_block_paths import PROMPT, SPLIT, _kernels
    from tests.fused_calls import count_fused_calls
    arch, scheme, path, _ = gptq_folder
    if scheme != "gptq-8-asym":
        pytest.skip("one asymmetric 8-bit model compiles the fused step")
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "inline")
    _, plain = _kernels(path, monkeypatch, fused=False)
    calls = count_fused_calls(monkeypatch)
    model, fused = _kernels(path, monkeypatch, fused=True)
    assert calls[0] == (len(PROMPT) - SPLIT + 1) * len(model.blocks)
    np.testing.assert_array_equal(fused, plain)


def test_gptq_weights_are_exact(gptq_folder):
    """The loaded o_proj holds exactly scale * (q - zero) of the checkpoint, unpacked here on its own."""
    arch, scheme, path, _ = gptq_folder
    if scheme.startswith("ct-"):
        return _ct_weights_are_exact(scheme, path)
    from cpu_kernels.quant import QuantLinear
    bits = 8 if scheme.startswith("gptq-8") else 4
    t = load_file(os.path.join(path, "model.safetensors"))
    p = "model.layers.1.self_attn.o_proj."
    words = t[p + "qweight"].numpy().view(np.uint32)
    nib = np.stack([(words >> (bits * j)) & ((1 << bits) - 1) for j in range(32 // bits)], -1)
    zw = t[p + "qzeros"].numpy().view(np.uint32)
    zn = np.stack([(zw >> (bits * j)) & ((1 << bits) - 1) for j in range(32 // bits)], -1)
    if scheme == "awq":  # (K, N / 8, slot) -> (K, N): slot i holds column 8 c + (0, 2, 4, 6, 1, 3, 5, 7)[i]
        inv = np.argsort([0, 2, 4, 6, 1, 3, 5, 7])
        q = nib[..., inv].reshape(words.shape[0], -1).astype(np.float32)
        z = zn[..., inv].reshape(zw.shape[0], -1).astype(np.float32)
    else:  # (K / per, N, slot) -> (K, N); zeros stored minus one
        q = nib.transpose(0, 2, 1).reshape(-1, words.shape[1]).astype(np.float32)
        z = zn.reshape(zw.shape[0], -1).astype(np.float32) + 1
    s = t[p + "scales"].numpy().astype(np.float32)
    g = t[p + "g_idx"].numpy() if p + "g_idx" in t else np.arange(q.shape[0]) // 128
    want = ((q - z[g]) * s[g]).T
    ws = open_weights(path)
    info = ws.info("blk.1.attn_output.weight")
    perm = ws.in_perm("blk.1.attn_output.weight")  # act-order: the inputs stored sorted by group
    got = QuantLinear.from_raw(info.ggml_type, ws.raw("blk.1.attn_output.weight"), info.shape).dequantize()
    assert (perm is not None) == scheme.endswith("actorder")
    np.testing.assert_array_equal(got, want if perm is None else want[:, perm])


def _ct_weights_are_exact(scheme, path):
    from cpu_kernels.quant import QuantLinear
    bits = 4 if "w4" in scheme else 8
    t = load_file(os.path.join(path, "model.safetensors"))
    p = "model.layers.1.self_attn.o_proj."
    off = 1 << (bits - 1)
    if scheme == "ct-w8a8":
        q = t[p + "weight"].numpy().astype(np.float32)
    else:
        words = t[p + "weight_packed"].numpy().view(np.uint32)  # (N, K / per): value j of a word at bits j * bits
        nib = np.stack([(words >> (bits * j)) & ((1 << bits) - 1) for j in range(32 // bits)], -1)
        q = nib.reshape(words.shape[0], -1).astype(np.float32) - off
    s = t[p + "weight_scale"].to(torch.float32).numpy()  # (N, groups)
    z = np.zeros_like(s)
    if p + "weight_zero_point" in t:  # (N / per, groups), packed along the outputs
        zw = t[p + "weight_zero_point"].numpy().view(np.uint32)
        zn = np.stack([(zw >> (bits * j)) & ((1 << bits) - 1) for j in range(32 // bits)], 1)
        z = zn.reshape(-1, zw.shape[1]).astype(np.float32) - off
    group = q.shape[1] // s.shape[1]
    g = t[p + "weight_g_idx"].numpy() if p + "weight_g_idx" in t else np.arange(q.shape[1]) // group
    want = (q - z[:, g]) * s[:, g]
    ws = open_weights(path)
    info = ws.info("blk.1.attn_output.weight")
    perm = ws.in_perm("blk.1.attn_output.weight")  # act-order: the inputs stored sorted by group
    got = QuantLinear.from_raw(info.ggml_type, ws.raw("blk.1.attn_output.weight"), info.shape).dequantize()
    assert (perm is not None) == scheme.endswith("actorder")
    np.testing.assert_array_equal(got, want if perm is None else want[:, perm])


@pytest.fixture(scope="module")
def q4_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("gptq-errors")
    tiny_model("qwen3").save_pretrained(str(root / "float"), safe_serialization=True)
    write_quantized_folder(str(root / "float"), str(root / "gptq"), "gptq-4")
    return str(root / "gptq")


def _asym(t):
    key = "model.layers.0.mlp.up_proj.qzeros"
    t[key] = t[key] + 1  # zero points of 9: asymmetric


def _uneven_groups(t):
    key = "model.layers.0.mlp.up_proj.g_idx"
    t[key] = t[key].clone()
    t[key][0] = 1  # group 0 keeps 127 inputs, group 1 gets 129: not act-order's whole groups


@pytest.mark.parametrize("config, tensors, message", [
    (lambda qc: {"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"group_0": {
        "weights": {"type": "int", "num_bits": 8, "strategy": "channel", "symmetric": False}}}}, None,
     "asymmetric int-quantized .W8A8. weights are not supported"),
    (lambda qc: {**qc, "bits": 3}, None, "gptq bits 3 are not supported"),
    (lambda qc: {"quant_method": "awq", "bits": 4, "version": "gemv"}, None, "awq version 'gemv' is not supported"),
    (lambda qc: {**qc, "group_size": 48}, None, "gptq group_size 48 is not supported"),
    (None, _asym, "zero points other than 8 in a symmetric checkpoint"),
    (None, _uneven_groups, "does not give each group 128 inputs"),
    (None, lambda t: t.pop("model.layers.1.self_attn.k_proj.scales"), "missing tensor 'model.layers.1.self_attn.k_proj.scales'"),
])
def test_unsupported_or_broken_gptq_is_refused(q4_folder, tmp_path, config, tensors, message):
    with pytest.raises(ModelLoadError, match=message):
        load_model(edited_copy(q4_folder, tmp_path, config, tensors))


@pytest.fixture(scope="module", params=["llama", "qwen3moe"])
def actorder_folder(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"gptq-actorder-{request.param}")
    src, dst = str(root / "float"), str(root / "gptq")
    tiny_model(request.param).save_pretrained(src, safe_serialization=True)
    decoded = write_quantized_folder(src, dst, "gptq-4-actorder")
    ref = transformers.AutoModelForCausalLM.from_pretrained(reference_folder(src, str(root / "ref"), decoded),
                                                            dtype=torch.float32, attn_implementation="eager").eval()
    return dst, ref


@pytest.mark.parametrize("weight_dtype", ["packed", "float32"])
def test_act_order_layers_on_the_device_path(actorder_folder, weight_dtype):
    """Act-order layers (and experts, each in its own input order) placed on a device (torch's CPU device here)
    gather their inputs as the CPU path does: float activations there, so transformers' logits on the decoded weights
    to float32 rounding."""
    from tests.offload.helpers import PROMPTS as prompts, batched, incremental, placed
    path, ref = actorder_folder
    model, runner, p, _ = placed(path, n_gpu_layers="all", gpu_weight_dtype=weight_dtype)
    for got, prompt in zip(batched(runner, prompts) + [incremental(runner, prompts[0])], prompts + prompts[:1]):
        want = hf_logits(ref, prompt).numpy()
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < 1e-3, err


def test_act_order_experts_keep_their_own_input_orders(actorder_folder):
    """Each expert's inputs are stored in its own order; the fused decode step (one order per matmul) steps aside."""
    from engine.model.parts.moe import MoE
    path, _ = actorder_folder
    ws = open_weights(path)
    name = "blk.0.ffn_up_exps.weight"
    if name not in ws.names():
        pytest.skip("a dense model")
    perms = ws.in_perm(name)
    assert perms.shape == (ws.info(name).shape[0], ws.info(name).shape[-1])
    assert len({p.tobytes() for p in perms}) > 1 and all(sorted(p) == list(range(perms.shape[1])) for p in perms)
    model, _ = load_model(path)
    moes = [part for b in model.blocks for part in b.parts if isinstance(part, MoE)]
    assert moes and all(m.fused() is None for m in moes)
