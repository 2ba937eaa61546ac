"""The planner on described machines (JSON device files) with synthetic 8B / 30B-MoE model shapes."""
from __future__ import annotations

import json

import pytest

from engine.args import EngineArgs
from offload import load_devices, plan, synthetic_meta
from offload.devices import devices_from_dict
from offload.meta import SHAPES
from offload.plan_types import GIB, PlacementPlan, PlanOptions
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


def test_a_longer_chosen_context_means_fewer_gpu_layers(gpu8, llama8b):
    p = plan(llama8b, gpu8, n_gpu_layers="auto", max_model_len=32768, max_num_seqs=1)  # one request: 4 GiB of KV
    n = len(p.gpu_layers())
    assert 0 < n < 32 and p.gpu_layers() == list(range(32 - n, 32)) and p.output_device == "cpu"
    assert gpu_use(p).total <= gpu_use(p).budget and (p.kv.num_blocks - 1) * 16 >= 32768
    assert p.layers[0].device == "cpu" and p.layers[0].kv_device == "cpu"


def test_auto_shrinks_the_kv_before_moving_layers_off_the_gpu(gpu8, llama8b):
    """4 requests of 8192 tokens want 4 GiB of KV; room for one (1 GiB) leaves every layer on the GPU, so
    the KV gets what is left (llama.cpp's --fit order) and the plan says what was traded."""
    p = plan(llama8b, gpu8, n_gpu_layers="auto", max_model_len=8192, max_num_seqs=4)
    assert p.gpu_layers() == list(range(32)) and p.output_device == "cuda:0"
    assert 8192 < (p.kv.num_blocks - 1) * 16 < 4 * 8192 and p.kv.limited_by.startswith("room left on cuda:0")
    assert gpu_use(p).total <= gpu_use(p).budget
    traded = [r for r in p.reasons if r.startswith("auto: traded KV for layers")]
    assert traded and "of the 32768 tokens wanted; room for all of them would have left 23 of 32 layers" in traded[0]
    # Without --max-model-len the model's 131072 need not fit: llama.cpp's 4096-token minimum is kept.
    unset = plan(llama8b, gpu8, n_gpu_layers="auto")
    assert unset.gpu_layers() == list(range(32)) and any("llama.cpp's --fit minimum" in r for r in unset.reasons)
    assert any("less than max_model_len 131072" in w for w in unset.warnings)
    # The load hook passes the resolved length; EngineArgs tell that the user did not choose it.
    hook = PlanOptions.from_args(EngineArgs(n_gpu_layers="auto"), max_model_len=131072, kv_pool_blocks=10 ** 6)
    assert not hook.max_model_len_set and not PlanOptions.from_args(hook, num_cpu_blocks=4).max_model_len_set
    assert plan(llama8b, gpu8, hook).gpu_layers() == list(range(32))


def gpu_machine(gpu_gib: float, ram_gib: float):
    gpu = dict(GPU8["gpus"][0], total_gib=gpu_gib, free_gib=gpu_gib)
    return devices_from_dict({"ram": {"total_gib": ram_gib, "available_gib": 0.9 * ram_gib}, "gpus": [gpu]})


def on_gpu(p: PlacementPlan) -> tuple[int, int, bool]:
    """(GPU layers, GPU layers whose routed experts are on the GPU too, output matrix on the GPU)."""
    gpu = [lp for lp in p.layers if lp.device != "cpu"]
    return len(gpu), sum(not lp.tensors_elsewhere for lp in gpu), p.output_device != "cpu"


@pytest.mark.parametrize("gpu_gib", [2, 8, 24, 80])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_more_ram_never_means_fewer_gpu_layers(shape, gpu_gib):
    """Was: `auto` reserved a GPU KV pool sized from RAM before placing layers (llama-8b on 24 GiB: 32 layers
    with 32 GiB of RAM, 24 with 64, 6 with 256, 3 with 512). Also through EngineArgs with the engine's
    RAM-sized pool, as the load hook passes it."""
    meta = synthetic_meta(shape)
    for how in ("plan", "engine"):
        seen = []
        for ram in (32, 64, 128, 256, 512):
            kw = dict(kv_pool_blocks=ram * 4000, max_model_len=meta.max_position_embeddings) if how == "engine" else {}
            p = plan(meta, gpu_machine(gpu_gib, ram), EngineArgs(n_gpu_layers="auto"), **kw)
            assert gpu_use(p) is None or gpu_use(p).total <= gpu_use(p).budget
            seen.append(on_gpu(p))
        assert all(a <= b for x, y in zip(seen, seen[1:]) for a, b in zip(x, y)), (how, seen)
    if gpu_gib >= 8 and shape in ("llama-8b", "qwen3-8b", "gemma-3-270m"):
        assert seen[0][0] == meta.num_layers and seen[0][2], seen  # a Q4 8B fits on 8 GiB with a 4096-token KV
    if shape == "gemma-3-270m":
        assert seen[0] == (18, 18, True), seen  # was 15 of 18 (and 0 or 1 with a 2 GiB GPU and 64+ GiB of RAM)


def test_override_tensor_says_what_stays_in_ram(gpu8, moe30b):
    """Was: `auto` with exps=CPU said "all 48 layers and the output matrix fit" and nothing about the experts."""
    p = plan(moe30b, gpu8, n_gpu_layers="auto", override_tensor="exps=CPU", max_model_len=4096, max_num_seqs=2)
    fit = [r for r in p.reasons if r.startswith("auto: all 48 layers")]
    assert fit and fit[0].endswith("; --override-tensor keeps the routed experts (with their router) of layers "
                                   "0-47 (16.39 GiB) in RAM")
    explicit = plan(moe30b, gpu8, n_gpu_layers="all", override_tensor="exps=CPU", max_model_len=4096)
    assert any("--override-tensor keeps the routed experts" in r for r in explicit.reasons)
    attn = plan(synthetic_meta("llama-8b"), gpu8, n_gpu_layers="0", override_tensor=r"blk\.0\.attn_q=GPU")
    assert any("--override-tensor keeps the attn_q of layer 0 (0.01 GiB) on cuda:0" in r for r in attn.reasons)


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
    assert p.usage_of("cpu").weights > 10 * GIB and gpu_use(p).total <= gpu_use(p).budget
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
    auto = plan(llama8b, gpu8, n_gpu_layers="auto", cpu_offload_gb=2.0, max_model_len=32768, max_num_seqs=1)
    plain = plan(llama8b, gpu8, n_gpu_layers="auto", max_model_len=32768, max_num_seqs=1)
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


def test_sliding_window_layers_count_what_their_windows_hold(tmp_path):
    """gemma-3-270m: 15 of 18 layers slide over 512 tokens. Their cache groups free the blocks that leave the
    window, so the plan counts them at what max_num_seqs requests' windows hold, the 3 full layers at the pool; a
    small GPU then holds more context than counting every layer at the pool would leave room for."""
    from engine.core.kv_spec import sliding_pool_blocks
    gemma = synthetic_meta("gemma-3-270m", "q4_k_m")
    windows = [gemma.layer_cache(i).window for i in range(18)]
    assert windows.count(512) == 15 and windows.count(0) == 3
    per = gemma.kv.bytes_per_block(16, "auto")
    cap = sliding_pool_blocks(512, 16, 4, 2048, 32768)
    assert cap == 4 * (-(-(511 + 2048) // 16) + 1 + 512 // 16) + 1 == 773
    p = plan(gemma, gpu_machine(8, 32), n_gpu_layers="all", max_model_len=32768, max_num_seqs=4)
    n = p.kv.num_blocks
    assert n == 4 * 2048 + 1 and gpu_use(p).kv == 3 * per * n + 15 * per * cap
    assert any("sliding-window layers hold at most 773" in r for r in p.reasons)
    small = plan(gemma, gpu_machine(1.75, 32), n_gpu_layers="all", max_model_len=32768, max_num_seqs=4)
    u, n = gpu_use(small), small.kv.num_blocks
    assert small.kv.limited_by.startswith("room left") and u.total <= u.budget
    assert n > cap and u.kv == 3 * per * n + 15 * per * cap
    assert n > (u.budget - (u.total - u.kv)) // (18 * per)  # every layer at n blocks would not have fit
