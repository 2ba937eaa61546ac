"""`ramlm bench offload` sweeps placements of a tiny model on torch's CPU device and recommends one."""
from __future__ import annotations

from bench import offload as bench_offload
from tests.model.tiny_models import tiny_model


def test_sweep_prints_a_table_and_a_recommendation(tmp_path, capsys):
    folder = tmp_path / "llama"
    tiny_model("llama").save_pretrained(folder, safe_serialization=True)
    bench_offload.main([str(folder), "--device", "cpu", "--layers", "0,1,all", "--kv", "gpu,ram", "--batch", "1,2",
                        "--prompt-tokens", "8", "--gen-tokens", "2", "--budget", "1", "--no-json"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip().startswith(("0 ", "1 ", "all "))]
    assert len(rows) == 2 * (1 + 2 + 2)  # batch sizes x (CPU only, 1 layer x KV gpu/ram, all x KV gpu/ram)
    assert "recommended for 1 GiB: --n-gpu-layers" in out


def test_recommendation_picks_the_fastest_fit():
    rows = [dict(batch=1, n_gpu_layers=n, kv=kv, decode_tok_s=d, prefill_tok_s=10.0, gpu_peak_bytes=g << 30,
                 gpu_planned_bytes=0) for n, kv, d, g in (("0", "gpu", 5.0, 0), ("16", "gpu", 9.0, 5),
                                                          ("32", "gpu", 20.0, 9), ("32", "ram", 12.0, 7))]
    rec = bench_offload.recommend(rows, 8)
    assert (rec["n_gpu_layers"], rec["kv_offload"]) == ("32", True)
    assert bench_offload.recommend(rows, None) is None
