"""`ramlm bench offload` sweeps placements of a tiny model on torch's CPU device and recommends one."""
from __future__ import annotations

import json
import sys

import pytest

from bench import offload as bench_offload
from bench.offload_chart import SIZE_PX
from tests.model.tiny_models import tiny_model


def test_sweep_prints_a_table_and_a_recommendation(tmp_path, capsys):
    folder = tmp_path / "llama"
    tiny_model("llama").save_pretrained(folder, safe_serialization=True)
    bench_offload.main([str(folder), "--device", "cpu", "--layers", "0,1,all", "--kv", "gpu,ram", "--batch", "1,2",
                        "--prompt-tokens", "8", "--gen-tokens", "2", "--repeat", "1", "--budget", "1", "--no-json"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip().startswith(("0 ", "1 ", "all "))]
    assert len(rows) == 2 * (1 + 2 + 2)  # batch sizes x (CPU only, 1 layer x KV gpu/ram, all x KV gpu/ram)
    assert "recommended within --budget 1 GiB: --n-gpu-layers" in out


def test_each_placement_is_timed_repeatedly_and_recommended_without_a_budget(tiny_llama, tmp_path, capsys):
    """Was: one timed run per placement (2-7x apart between runs) and no recommendation without --budget."""
    out = tmp_path / "sweep.json"
    bench_offload.main([tiny_llama, "--device", "cpu", "--layers", "0,all", "--kv", "gpu", "--batch", "1",
                        "--prompt-tokens", "8", "--gen-tokens", "2", "--repeat", "3", "--out", str(out), "--no-chart"])
    text = capsys.readouterr().out
    figures = json.loads(out.read_text())["figures"]
    for r in figures["rows"]:
        assert r["repeat"] == 3
        for kind in ("prefill", "decode"):
            assert 0 < r[f"{kind}_tok_s_min"] <= r[f"{kind}_tok_s"] <= r[f"{kind}_tok_s_max"]
        assert f"{r['decode_tok_s']:.2f} [{r['decode_tok_s_min']:.2f}-{r['decode_tok_s_max']:.2f}]" in text
    rec = figures["recommendation"]  # no --budget: the planner's budget of torch's CPU device
    best = max(figures["rows"], key=lambda r: (r["decode_tok_s"], r["prefill_tok_s"]))
    assert rec["budget_source"].startswith("the planned budget of the GPU swept") and rec["budget_bytes"] > 0
    assert (rec["n_gpu_layers"], rec["decode_tok_s"]) == (best["n_gpu_layers"], best["decode_tok_s"])
    assert f"recommended within the planned budget of the GPU swept ({rec['budget_bytes'] / (1 << 30):.2f} GiB)" in text
    with pytest.raises(ValueError, match="--repeat must be >= 1"):
        bench_offload.main([tiny_llama, "--device", "cpu", "--repeat", "0"])


def test_recommendation_picks_the_fastest_fit():
    rows = [dict(batch=1, n_gpu_layers=n, kv=kv, decode_tok_s=d, prefill_tok_s=10.0, gpu_peak_bytes=g << 30,
                 gpu_planned_bytes=0, gpu_budget_bytes=b << 30)
            for n, kv, d, g, b in (("0", "gpu", 5.0, 0, 0), ("16", "gpu", 9.0, 5, 6), ("32", "gpu", 20.0, 9, 6),
                                   ("32", "ram", 12.0, 7, 6))]
    rec = bench_offload.recommend(rows, 8)
    assert (rec["n_gpu_layers"], rec["kv_offload"]) == ("32", True)
    rec = bench_offload.recommend(rows)  # the planner's 6 GiB
    assert (rec["n_gpu_layers"], rec["kv_offload"], rec["budget_bytes"]) == ("16", False, 6 << 30)
    assert bench_offload.recommend([]) is None


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama_chart")
    tiny_model("llama").save_pretrained(folder, safe_serialization=True)
    return str(folder)


def sweep(folder, out) -> None:
    """Two placements (all on the CPU; every layer and the KV on torch's device), batch 1."""
    bench_offload.main([folder, "--device", "cpu", "--layers", "0,all", "--kv", "gpu", "--batch", "1",
                        "--prompt-tokens", "8", "--gen-tokens", "2", "--repeat", "1", "--out", str(out)])


def test_sweep_draws_a_png_next_to_the_json(tiny_llama, tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image  # a matplotlib dependency
    out = tmp_path / "sweep.json"
    sweep(tiny_llama, out)
    rows = json.loads(out.read_text())["figures"]["rows"]
    assert [(r["n_gpu_layers"], r["kv"]) for r in rows] == [("0", "gpu"), ("all", "gpu")]
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = Image.open(png)
    img.verify()
    img = Image.open(png)
    assert img.size == SIZE_PX
    assert len(img.convert("RGB").getcolors(maxcolors=1 << 20)) > 20  # bars, text, axes: not a blank canvas


def test_without_matplotlib_the_json_is_still_written(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    out = tmp_path / "sweep.json"
    sweep(tiny_llama, out)
    assert "matplotlib is not installed, so no chart was drawn" in capsys.readouterr().out
    assert len(json.loads(out.read_text())["figures"]["rows"]) == 2
    assert not out.with_suffix(".png").exists()
