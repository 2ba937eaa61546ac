"""Device probing and JSON device descriptions."""
from __future__ import annotations

import subprocess
import sys

import pytest

from offload.devices import GIB, devices_from_dict, load_devices, normalize_device, probe_devices
from tests.offload.helpers import write_devices


def test_import_touches_no_gpu_runtime():
    code = ("import sys, types, offload, offload.apply\n"
            "from engine.args import EngineArgs\n"
            "from engine.core.kv_spec import LayerKV\n"
            "model = types.SimpleNamespace(kv_layout=(LayerKV(2, 8),) * 2)  # all apply_placement reads without a GPU\n"
            "assert offload.apply_placement(EngineArgs(), model, 128, 10) == (10,)\n"
            "bad = [m for m in ('torch', 'torch.cuda', 'triton') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_probe_finds_ram():
    d = probe_devices(gpus=False)
    assert d.ram.name == "cpu" and d.ram.total_bytes > 0 and 0 < d.ram.free_bytes <= d.ram.total_bytes
    assert d.gpus == ()


def test_probe_without_a_gpu_runtime_lists_no_gpu():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert probe_devices().gpus == ()


def test_description_file(tmp_path):
    desc = {"ram": {"total_gib": 64, "available_bytes": 50 * GIB},
            "gpus": [{"name": "CUDA1", "total_gib": 24, "free_gib": 20, "compute_capability": "8.6"},
                     {"name": "mps", "kind": "mps", "total_gib": 48, "shared_with_host": True}]}
    d = load_devices(write_devices(tmp_path, desc), on_this_machine=False)
    assert d.ram.total_bytes == 64 * GIB and d.ram.free_bytes == 50 * GIB
    a, b = d.gpus
    assert (a.name, a.kind, a.free_bytes, a.supports_bf16()) == ("cuda:1", "cuda", 20 * GIB, True)
    assert (b.name, b.free_bytes, b.shared_with_host) == ("mps", 48 * GIB, True)
    assert d.gpu("cuda:1") is a and d.gpu(None) is a and d.gpu("cuda:7") is None
    t = d.gpu("cpu")
    assert t.name == "torch-cpu" and t.shared_with_host and t.total_bytes == 64 * GIB
    assert d.source.endswith("devices.json")
    with pytest.raises(ValueError, match="total"):
        devices_from_dict({"ram": {"total_gib": 8}, "gpus": [{"name": "cuda:0"}]})


def test_description_can_override_probed_facts():
    d = devices_from_dict({"probe": True, "ram": {"available_gib": 3}})
    real = probe_devices(gpus=False)
    assert d.ram.total_bytes == real.ram.total_bytes and d.ram.free_bytes == 3 * GIB


@pytest.mark.parametrize("given,want", [("cpu", "torch-cpu"), ("cuda", "cuda:0"), ("CUDA1", "cuda:1"),
                                        ("rocm:0", "cuda:0"), ("xpu", "xpu:0"), ("mps", "mps"), ("cuda:2", "cuda:2")])
def test_device_spellings(given, want):
    assert normalize_device(given) == want
