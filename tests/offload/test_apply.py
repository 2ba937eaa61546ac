"""Mixed placements on torch's CPU device give the all-Numba logits: tiny random models, fp32 and Q4_K."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.model.gguf_export import default_qtype, write_gguf
from engine.model.weights import open_weights
from gpu_kernels.modules import DeviceBlock, HostModule, OnDevice
from tests.model.tiny_models import tiny_model
from tests.offload.helpers import (PROMPTS, batched, cpu_runner, decode_batch, incremental, placed, rel_err)

# dense + normal rope; MoE + QK-norm; sandwich + window + softcap; MLA's latent cache (one array, V is K) + MoE
ARCHES = ["llama", "qwen3moe", "gemma3", "deepseek2"]


@pytest.fixture(scope="module", params=ARCHES)
def tiny(request, tmp_path_factory):
    """(arch, fp32 HF folder, Q4_K GGUF, number of layers)."""
    arch = request.param
    model = tiny_model(arch)
    folder = tmp_path_factory.mktemp(arch)
    model.save_pretrained(folder, safe_serialization=True)
    ws = open_weights(str(folder))
    tensors = {n: np.asarray(ws.raw(n), dtype=np.float32) for n in ws.names()}
    path = str(folder / f"{arch}-q4_k.gguf")
    write_gguf(path, ws.config, tensors, default_qtype(gguf.GGMLQuantizationType.Q4_K))
    return arch, str(folder), path, ws.config.num_layers


def half(n: int) -> str:
    return str(n // 2)


def test_half_the_layers_on_the_torch_path_match_numba_fp32(tiny):
    arch, folder, _, L = tiny
    ref = batched(cpu_runner(folder))
    model, runner, p, _ = placed(folder, n_gpu_layers=half(L))
    assert p.gpu_layers() == list(range(L - L // 2, L))
    assert [isinstance(b, DeviceBlock) for b in model.blocks] == [i >= L - L // 2 for i in range(L)]
    for got, want in zip(batched(runner), ref):
        assert rel_err(got, want) < 1e-4, arch


def test_through_the_cache_fp16_kv(tiny):
    """Prefill, then decode steps (one sequence, then two in one step) over fp16 KV blocks on the device."""
    arch, folder, _, L = tiny
    ref = cpu_runner(folder, kv="fp16")
    _, runner, _, _ = placed(folder, kv="fp16", n_gpu_layers=half(L))
    assert rel_err(incremental(runner), incremental(ref)) < 2e-3, arch
    ref2 = cpu_runner(folder, kv="fp16")
    _, runner2, _, _ = placed(folder, kv="fp16", n_gpu_layers=half(L))
    for got, want in zip(decode_batch(runner2), decode_batch(ref2)):
        assert rel_err(got, want) < 2e-3, arch


def _assert_close_q(arch, got_rows, want_rows, tol=5e-2):
    """Quantized weights: the Numba path rounds activations to int8 (as llama.cpp), the torch path does
    not, so logits differ by 1-3 % (test_architectures allows 5 % against transformers). A MoE router near
    a tie can then pick another expert for a row."""
    ok = [rel_err(g, w) < tol for g, w in zip(got_rows, want_rows)]
    need = 0.75 if arch in ("qwen3moe", "deepseek2") else 1.0
    assert sum(ok) >= need * len(ok), (arch, ok)


def test_q4k_packed_on_device_matches_numba(tiny):
    arch, _, path, L = tiny
    ref = batched(cpu_runner(path))
    model, runner, p, _ = placed(path, n_gpu_layers="all", gpu_weight_dtype="packed")
    assert {lp.weight_format for lp in p.layers} == {"packed"} and p.output_device == "torch-cpu"
    assert isinstance(model.lm_head, OnDevice)
    for got, want in zip(batched(runner), ref):
        _assert_close_q(arch, got, want)


def test_q4k_torch_path_is_exact_given_the_same_int8_activations(tiny, monkeypatch):
    """Feed the torch matmuls the activations rounded as the Numba kernels round them: what is left is
    float32 summation order, so the packed dequantization and the whole port are exact."""
    import torch
    from cpu_kernels.quant.linear import q8_roundtrip
    from gpu_kernels import linear as gl
    arch, _, path, L = tiny
    if arch == "deepseek2":
        pytest.skip("MLA chains quantized matmuls (q_a -> q_b, v_b -> o): one rounding-boundary step early in a "
                    "prompt reaches its later rows through the cache and the router; tests/offload/test_mla_offload.py "
                    "checks a layer")
    ref = batched(cpu_runner(path))
    _, runner, _, _ = placed(path, n_gpu_layers="all", gpu_weight_dtype="packed")
    matmul = gl.DeviceWeight.matmul

    def rounded(self, x):
        if self.ggml_type.name not in ("F32", "F16", "BF16"):
            x = torch.from_numpy(q8_roundtrip(x.numpy()))
        return matmul(self, x)
    monkeypatch.setattr(gl.DeviceWeight, "matmul", rounded)
    errs = [rel_err(g, w) for got, want in zip(batched(runner), ref) for g, w in zip(got, want)]
    # A row whose activation sits on an int8 rounding boundary can move by one step: allow a few.
    assert float(np.median(errs)) < 1e-5 and max(errs) < 5e-2, (arch, errs)


def test_packed_and_dequantized_weights_agree(tiny):
    """Packed blocks dequantized per matmul and weights dequantized once are the same numbers."""
    arch, _, path, L = tiny
    _, r1, _, _ = placed(path, n_gpu_layers=half(L), gpu_weight_dtype="packed")
    _, r2, _, _ = placed(path, n_gpu_layers=half(L), gpu_weight_dtype="float32")
    for a, b in zip(batched(r1), batched(r2)):
        assert rel_err(a, b) < 1e-5, arch


def test_kv_offload_runs_attention_on_the_cpu_cache(tiny):
    arch, folder, _, L = tiny
    ref = cpu_runner(folder, kv="fp16")
    _, runner, p, _ = placed(folder, kv="fp16", n_gpu_layers="all", kv_offload=True)
    assert {lp.kv_device for lp in p.layers} == {"cpu"}
    assert all(isinstance(kv[0], np.ndarray) for kv in runner.kv_caches)
    assert rel_err(incremental(runner), incremental(ref)) < 2e-3, arch


def test_streamed_layers_cpu_offload_gb(tiny):
    """--cpu-offload-gb: the first GPU layers keep their weights in RAM and copy them in at every call."""
    arch, _, path, L = tiny
    ref = batched(cpu_runner(path))
    model, runner, p, _ = placed(path, n_gpu_layers="all", gpu_weight_dtype="auto", cpu_offload_gb=0.01)
    assert [lp.weights for lp in p.layers] == ["streamed"] * L
    assert model.blocks[0].parts[0].q.weight.streamed
    for got, want in zip(batched(runner), ref):
        _assert_close_q(arch, got, want)


def test_blocks_own_their_kv_without_a_runner_and_bind_later(tiny):
    """The engine's order: apply the plan at load, build the runner afterwards."""
    from engine.model.loader import load_model
    from engine.worker.runner import ModelRunner
    from offload.apply import apply_plan, bind_runner
    from tests.offload.helpers import BLOCK_SIZE, NUM_BLOCKS
    arch, folder, _, L = tiny
    ref = batched(cpu_runner(folder))
    _, _, p, _ = placed(folder, n_gpu_layers=half(L))
    model, _ = load_model(folder)
    apply_plan(model, p, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, kv_cache_dtype="fp32")
    runner = ModelRunner(model, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, kv_cache_dtype="fp32")
    for got, want in zip(batched(runner), ref):
        assert rel_err(got, want) < 1e-4, arch
    assert bind_runner(runner, model) == L // 2
    assert isinstance(runner.kv_caches[-1][0], torch.Tensor) and isinstance(runner.kv_caches[0][0], np.ndarray)


def test_undo_restores_the_cpu_model(tiny):
    arch, folder, _, L = tiny
    ref = batched(cpu_runner(folder))
    model, runner, _, placement = placed(folder, n_gpu_layers="all")
    placement.undo()
    assert model.placement is None and not any(isinstance(b, DeviceBlock)
                                               for b in model.blocks)
    for got, want in zip(batched(runner), ref):
        np.testing.assert_array_equal(got, want)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


@pytest.mark.parametrize("device,layers", [("cpu", "all"), ("cpu", "half"),
                                           pytest.param("cuda:0", "half", marks=CUDA)],
                         ids=["all", "mixed", "cuda-mixed"])
def test_kv_blocks_round_trip_through_the_ram_tier(tiny, device, layers):
    """Prefill, swap the sequence's blocks out to the RAM tier, wipe them, swap them back into other block
    ids, and decode: the same logits as without the trip. In a mixed placement the RAM layers' numpy KV
    travels too (the block ids are shared by every layer)."""
    from engine.worker.runner import SeqChunk
    arch, folder, _, L = tiny
    ngl = half(L) if layers == "half" else "all"
    prompt = PROMPTS[0]
    _, ref, _, _ = placed(folder, kv="fp16", n_gpu_layers=ngl, gpu_device=device)
    _, runner, p, placement = placed(folder, kv="fp16", n_gpu_layers=ngl, gpu_device=device, num_cpu_blocks=8)
    tier = placement.kv_tier
    assert p.kv.num_cpu_blocks == 8 and tier is not None and not tier.allocated
    assert sorted(tier.layers) == list(range(L))
    old, new = (1, 2, 3, 4), (9, 10, 11, 12)  # 13 tokens in 4-token blocks
    ref.execute([SeqChunk(tuple(prompt[:12]), 0, old, "none")])
    want = ref.execute([SeqChunk((prompt[12],), 12, old, "last")])[0]
    runner.execute([SeqChunk(tuple(prompt[:12]), 0, old, "none")])
    tier.swap_out(old, [0, 1, 2, 3])
    for i in tier.layers:
        runner.kv_caches[i][0][list(old)] = 0
        runner.kv_caches[i][1][list(old)] = 0
    tier.swap_in([0, 1, 2, 3], new)
    got = runner.execute([SeqChunk((prompt[12],), 12, new, "last")])[0]
    np.testing.assert_array_equal(got, want)
    assert tier.allocated and tier.nbytes() > 0


def test_override_tensor_keeps_matches_in_ram(tmp_path_factory):
    """exps=CPU on a MoE: attention on the device, experts (+ router) run by Numba from RAM; and a
    dense matrix moved onto the device inside a CPU layer."""
    model = tiny_model("qwen3moe")
    folder = tmp_path_factory.mktemp("moe_ot")
    model.save_pretrained(folder, safe_serialization=True)
    ref = batched(cpu_runner(str(folder)))
    m, runner, p, _ = placed(str(folder), n_gpu_layers="all", override_tensor="exps=CPU")
    assert all(isinstance(b.parts[1], HostModule) for b in m.blocks)
    assert all("blk.%d.ffn_up_exps.weight" % lp.index in lp.tensors_elsewhere for lp in p.layers)
    for got, want in zip(batched(runner), ref):
        assert rel_err(got, want) < 1e-4
    m2, runner2, p2, _ = placed(str(folder), n_gpu_layers="1", override_tensor="blk\\.0\\.attn_q=GPU")
    assert isinstance(m2.blocks[0].parts[0].q, OnDevice) and p2.layers[0].tensors_elsewhere
    for got, want in zip(batched(runner2), ref):
        assert rel_err(got, want) < 1e-4
    assert PROMPTS  # the helpers' prompts were used


@CUDA
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-3), ("bfloat16", 5e-2)])
def test_half_the_layers_on_cuda(tiny, dtype, tol):
    """The same check on a real GPU: prefill batch, then decode through device KV blocks."""
    arch, folder, _, L = tiny
    ref = batched(cpu_runner(folder))
    _, runner, p, _ = placed(folder, gpu_device="cuda:0", n_gpu_layers=half(L), gpu_weight_dtype=dtype)
    assert p.gpu_device == "cuda:0" and runner.kv_caches[-1][0].is_cuda
    for got, want in zip(batched(runner), ref):
        _assert_close_q(arch, got, want, tol)
    ref_inc = incremental(cpu_runner(folder, kv="fp16"))
    _, runner2, _, _ = placed(folder, kv="fp16", gpu_device="cuda:0", n_gpu_layers=half(L), gpu_weight_dtype=dtype)
    _assert_close_q(arch, incremental(runner2), ref_inc, tol)


@CUDA
@pytest.mark.parametrize("extra", [dict(gpu_weight_dtype="packed"), dict(kv_offload=True),
                                   dict(override_tensor="exps=CPU,ffn_up=CPU"), dict(cpu_offload_gb=0.01)],
                         ids=["packed", "kv_offload", "override", "streamed"])
def test_q4k_variants_on_cuda(tiny, extra):
    arch, _, path, L = tiny
    ref = batched(cpu_runner(path))
    kw = dict(gpu_weight_dtype="float32")
    kw.update(extra)
    _, runner, p, _ = placed(path, gpu_device="cuda:0", n_gpu_layers="all", **kw)
    if "cpu_offload_gb" in extra:
        assert any(lp.weights == "streamed" for lp in p.layers)
    # packed computes in bfloat16 on the GPU: its rounding adds to the int8-activation difference
    tol = 8e-2 if extra.get("gpu_weight_dtype") == "packed" else 5e-2
    for got, want in zip(batched(runner), ref):
        _assert_close_q(arch, got, want, tol)
