"""The planner on described machines (JSON device files) with synthetic 8B / 30B-MoE model shapes."""
from __future__ import annotations

import json

import pytest

from offload import load_devices, plan, synthetic_meta
from offload.plan_types import GIB, PlacementPlan
from tests.offload.helpers import CPU_ONLY, write_devices

GPU8 = {"ram": {"total_gib": 32, "available_gib": 28},
        "gpus": [{"name": "cuda:0", "kind": "cuda", "description": "RTX 4060", "total_gib": 8, "free_gib": 7.7,
                  "compute_capability": "8.9"}]}
APU96 = {"ram": {"total_gib": 128, "available_gib": 120},
         "gpus": [{"name": "cuda:0", "kind": "rocm", "description": "Radeon 8060S", "total_gib": 96, "free_gib": 95,
                   "compute_capability": "gfx1151", "shared_with_host": True}]}
SHORT = dict(max_model_len=4096, max_num_seqs=1)  # 0.5 GiB of KV for all 32 layers of llama-8b


@pytest.fixture(scope="module")
def llama8b():
    return synthetic_meta("llama-8b", "q4_k_m")


@pytest.fixture(scope="module")
def moe30b():
    return synthetic_meta("qwen3-moe-30b-a3b", "q4_k_m")


@pytest.fixture
def gpu8(tmp_path):
    return load_devices(write_devices(tmp_path, GPU8), on_this_machine=False)


@pytest.fixture
def apu(tmp_path):
    return load_devices(write_devices(tmp_path, APU96), on_this_machine=False)


def gpu_use(p: PlacementPlan):
    return p.usage_of(p.gpu_device)


def test_synthetic_shapes_have_the_sizes_of_the_real_files(llama8b, moe30b):
    # Meta-Llama-3-8B Q4_K_M is 4.92 GB, Qwen3-30B-A3B Q4_K_M 18.6 GB (llama.cpp's files).
    assert abs(llama8b.total_bytes / 1e9 - 4.92) < 0.1
    assert abs(moe30b.total_bytes / 1e9 - 18.6) < 0.3
    assert llama8b.num_layers == 32 and not llama8b.is_moe and moe30b.is_moe


def test_no_gpu_keeps_everything_in_ram(tmp_path, llama8b):
    devices = load_devices(write_devices(tmp_path, CPU_ONLY), on_this_machine=False)
    p = plan(llama8b, devices, n_gpu_layers="auto", **SHORT)
    assert p.gpu_device is None and p.gpu_layers() == [] and p.output_device == "cpu"
    assert any("no GPU" in r for r in p.reasons) and not p.warnings
    explicit = plan(llama8b, devices, n_gpu_layers="16", **SHORT)
    assert explicit.gpu_layers() == [] and any("no GPU" in w for w in explicit.warnings)
    assert [u.device for u in p.usage] == ["cpu"]


def test_8gib_gpu_holds_all_of_an_8b_q4_model(gpu8, llama8b):
    p = plan(llama8b, gpu8, n_gpu_layers="auto", **SHORT)
    assert p.gpu_layers() == list(range(32)) and p.output_device == "cuda:0"
    u = gpu_use(p)
    assert u.total <= u.budget == int(8 * GIB * 0.9) - int(0.3 * GIB)
    assert u.kv == p.kv.num_blocks * p.kv.bytes_per_block_per_layer * 32
    assert p.kv.tokens >= 4096 and p.compute_dtype == "bfloat16"
    assert not p.warnings
    assert any("all 32 layers and the output matrix fit" in r for r in p.reasons)


def test_more_kv_means_fewer_gpu_layers(gpu8, llama8b):
    p = plan(llama8b, gpu8, n_gpu_layers="auto", max_model_len=8192, max_num_seqs=4)  # 4 GiB of KV
    n = len(p.gpu_layers())
    assert 0 < n < 32 and p.gpu_layers() == list(range(32 - n, 32)) and p.output_device == "cpu"
    assert gpu_use(p).total <= gpu_use(p).budget
    assert p.layers[0].device == "cpu" and p.layers[0].kv_device == "cpu"


def test_explicit_layers_are_the_last_ones_and_shrink_the_kv_to_fit(gpu8, llama8b):
    p = plan(llama8b, gpu8, n_gpu_layers="10", **SHORT)
    assert p.gpu_layers() == list(range(22, 32)) and p.output_device == "cpu"
    assert any("pointless" in w for w in p.warnings)  # everything would fit
    big = plan(llama8b, gpu8, n_gpu_layers="all", max_model_len=8192, max_num_seqs=16)
    assert big.kv.limited_by.startswith("room left on cuda:0") and big.kv.tokens < 8192 * 16
    assert gpu_use(big).total <= gpu_use(big).budget
    with pytest.raises(ValueError, match="budget"):
        plan(llama8b, gpu8, n_gpu_layers="all", gpu_weight_dtype="float32", **SHORT)


def test_moe_auto_keeps_experts_in_ram_and_everything_else_on_the_gpu(gpu8, moe30b):
    p = plan(moe30b, gpu8, n_gpu_layers="auto", max_model_len=4096, max_num_seqs=2)
    assert p.gpu_layers() == list(range(48)) and p.output_device == "cuda:0"
    in_ram = [lp for lp in p.layers if "blk.%d.ffn_down_exps.weight" % lp.index in lp.tensors_elsewhere]
    assert 24 <= len(in_ram) < 48  # 16 GiB of experts cannot all sit in 8 GiB; some can
    assert all(set(lp.tensors_elsewhere.values()) == {"cpu"} for lp in in_ram)
    assert in_ram == list(p.layers[: len(in_ram)])  # experts come back to the GPU from the last layer down
    assert p.usage_of("cpu").weights > 12 * GIB and gpu_use(p).total <= gpu_use(p).budget
    assert any("routed experts" in r for r in p.reasons)


def test_override_tensor_exps_cpu(gpu8, moe30b):
    p = plan(moe30b, gpu8, n_gpu_layers="all", override_tensor="exps=CPU", gpu_weight_dtype="packed",
             max_model_len=4096, max_num_seqs=2)
    assert all(lp.device == "cuda:0" for lp in p.layers)
    for lp in p.layers:
        moved = {n for n, d in lp.tensors_elsewhere.items() if d == "cpu"}
        # the router moves with its experts
        assert moved == {f"blk.{lp.index}.ffn_{w}.weight" for w in ("gate_inp", "gate_exps", "up_exps", "down_exps")}
    assert gpu_use(p).weights < 2 * GIB
    assert any("override exps=cpu: matches 144 tensors" in r for r in p.reasons)


def test_apu_with_96gib_shared_memory(apu, moe30b, llama8b):
    p = plan(moe30b, apu, n_gpu_layers="auto", max_model_len=8192, max_num_seqs=8)
    assert p.shared_memory and p.gpu_layers() == list(range(48)) and p.output_device == "cuda:0"
    assert gpu_use(p).budget <= int(120 * GIB * 0.9)
    assert any("shares memory with the host" in r for r in p.reasons)
    partial = plan(llama8b, apu, n_gpu_layers="16", **SHORT)
    assert any("shares its memory with the host" in w for w in partial.warnings)


def test_kv_offload_and_cpu_tier(gpu8, llama8b):
    p = plan(llama8b, gpu8, n_gpu_layers="all", kv_offload=True, **SHORT)
    assert {lp.kv_device for lp in p.layers} == {"cpu"} and gpu_use(p).kv == 0
    assert p.usage_of("cpu").kv == p.kv.num_blocks * p.kv.bytes_per_block_per_layer * 32
    t = plan(llama8b, gpu8, n_gpu_layers="auto", num_cpu_blocks=512, **SHORT)
    assert t.kv.num_cpu_blocks == 512
    assert t.usage_of("cpu").kv == 512 * t.kv.bytes_per_block_per_layer * 32
    none = plan(llama8b, gpu8, n_gpu_layers="0", num_cpu_blocks=512, **SHORT)
    assert none.kv.num_cpu_blocks == 0
    # Mixed: the tier holds a swapped block in every layer, RAM-KV layers included.
    half = plan(llama8b, gpu8, n_gpu_layers="16", num_cpu_blocks=512, **SHORT)
    per = half.kv.bytes_per_block_per_layer
    assert half.usage_of("cpu").kv == half.kv.num_blocks * per * 16 + 512 * per * 32


def test_cpu_offload_gb_streams_layers(gpu8, llama8b):
    p = plan(llama8b, gpu8, n_gpu_layers="all", cpu_offload_gb=1.0, gpu_weight_dtype="packed", **SHORT)
    streamed = [lp for lp in p.layers if lp.weights == "streamed"]
    assert streamed and streamed[0].index == 0 and all(lp.device == "cuda:0" for lp in streamed)
    assert sum(lp.bytes["cpu"] for lp in streamed) <= GIB
    auto = plan(llama8b, gpu8, n_gpu_layers="auto", cpu_offload_gb=2.0, max_model_len=8192, max_num_seqs=4)
    plain = plan(llama8b, gpu8, n_gpu_layers="auto", max_model_len=8192, max_num_seqs=4)
    assert len(auto.gpu_layers()) > len(plain.gpu_layers())


def test_torch_cpu_device_and_bad_requests(gpu8, llama8b):
    p = plan(llama8b, gpu8, n_gpu_layers="8", gpu_device="cpu", **SHORT)
    assert p.gpu_device == "torch-cpu" and p.compute_dtype == "float32" and p.gpu_layers() == list(range(24, 32))
    with pytest.raises(ValueError, match="not found"):
        plan(llama8b, gpu8, n_gpu_layers="8", gpu_device="cuda:3")
    with pytest.raises(ValueError, match="n_gpu_layers"):
        plan(llama8b, gpu8, n_gpu_layers="many")
    with pytest.raises(ValueError, match="REGEX=DEVICE"):
        plan(llama8b, gpu8, n_gpu_layers="1", override_tensor="exps")


def test_plan_json_is_stable_and_round_trips(gpu8, moe30b):
    kw = dict(n_gpu_layers="auto", max_model_len=4096, max_num_seqs=2, override_tensor="blk\\.0\\..*=CPU")
    a, b = plan(moe30b, gpu8, **kw).to_json(), plan(moe30b, gpu8, **kw).to_json()
    assert a == b
    d = json.loads(a)
    assert set(d) >= {"layers", "kv", "usage", "reasons", "warnings", "embed_device", "output_device", "options"}
    assert d["layers"][5]["device"] == "cuda:0" and d["embed_device"] == "cpu"
    assert PlacementPlan.from_json(a).to_json() == a
    assert all(isinstance(r, str) and r for r in d["reasons"])
