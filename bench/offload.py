"""Offload sweep: prefill and decode speed, and memory per device, for placements of one model.

    python -m bench.offload MODEL [--device cuda:0|cpu] [--devices-file FILE] [--layers 0,8,16,24,all]
        [--kv gpu,ram] [--batch 1,4] [--prompt-tokens 128] [--gen-tokens 16] [--repeat 3] [--weight-dtype auto]
        [--budget GiB] [--time-limit S] [--out FILE.json] [--no-json] [--no-chart]

Loads the model once, then for each placement (GPU layers 0..all, KV on the GPU or in RAM) plans it,
applies it, times a prefill of B prompts and G decode steps of B sequences through the runner --repeat
times (one placement's single runs varied 2-7x), and undoes it. Rows report the median tokens/s and the
min-max of the runs. Prints a table, writes JSON (bench/results/offload-*.json, or --out) and next to it a
PNG chart (tokens/s and memory per device for each placement) when matplotlib is installed (the `bench`
extra). It recommends the fastest placement (median decode, then prefill, at the smallest batch) whose GPU
memory fits --budget GiB, or without it the planner's budget of the probed or described GPU. `--device cpu`
runs the GPU path on torch's CPU device (a machine without a GPU; the numbers then say nothing about GPUs).
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import time

import numpy as np

from bench.common import write_result
from bench.offload_chart import chart

GIB = 1 << 30


def layer_settings(spec: str | None, L: int) -> list[str]:
    if spec:
        return [s.strip() for s in spec.split(",") if s.strip()]
    steps = sorted({0, L // 4, L // 2, 3 * L // 4, L})
    return [str(n) for n in steps] + ["all"]


def configs(layers: list[str], kv: list[str]) -> list[tuple[str, bool]]:
    out = []
    for n in layers:
        if n == "0":
            out.append(("0", False))
            continue
        out += [(n, False)] * ("gpu" in kv) + [(n, True)] * ("ram" in kv)
    return out


def _peak_reset(dev: str) -> None:
    if dev.startswith("cuda"):
        import torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak(dev: str) -> int:
    if dev.startswith("cuda"):
        import torch
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    return 0


def spread(values: list[float]) -> dict:
    """Median and range of one figure over the repeats."""
    return {"median": float(statistics.median(values)), "min": min(values), "max": max(values)}


def time_batch(runner, ids, blocks, P: int, G: int) -> tuple[float, float]:
    """Seconds of one prefill of B prompts and of G decode steps of the B sequences."""
    from engine.worker.runner import SeqChunk
    B = len(ids)
    t0 = time.perf_counter()
    logits = runner.execute([SeqChunk(tuple(int(t) for t in ids[s]), 0, blocks[s], "last") for s in range(B)])
    prefill = time.perf_counter() - t0
    toks = [int(np.argmax(x[-1])) for x in logits]
    t0 = time.perf_counter()
    for g in range(G):
        logits = runner.execute([SeqChunk((toks[s],), P + g, blocks[s], "last") for s in range(B)])
        toks = [int(np.argmax(x[-1])) for x in logits]
    return prefill, time.perf_counter() - t0


def measure(model, p, args, batches, vocab: int) -> list[dict]:
    """Applies plan p, times each batch size args.repeat times, undoes the placement."""
    from engine.worker.runner import ModelRunner, SeqChunk
    from gpu_kernels import triton_dispatch
    from offload.apply import apply_plan
    P, G, bs = args.prompt_tokens, args.gen_tokens, 16
    per_seq = math.ceil((P + G) / bs)
    nb = p.kv.num_blocks
    runner = ModelRunner(model, nb, bs, "auto")
    t0 = time.perf_counter()
    placement = apply_plan(model, p, num_blocks=nb, block_size=bs, runner=runner, keep_originals=True)
    apply_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    rows = []
    try:
        runner.execute([SeqChunk(tuple(range(3, 19)), 0, tuple(range(1, 3)), "last")])  # warm-up
        runner.execute([SeqChunk((5,), 16, tuple(range(1, 3)), "last")])
        for B in batches:
            ids = rng.integers(3, vocab, size=(B, P))
            blocks = [tuple(range(1 + s * per_seq, 1 + (s + 1) * per_seq)) for s in range(B)]
            _peak_reset(p.gpu_device or "")
            launched = dict(triton_dispatch.calls)
            runs = [time_batch(runner, ids, blocks, P, G) for _ in range(args.repeat)]
            prefill = spread([B * P / pre for pre, _ in runs])
            decode = spread([B * G / dec for _, dec in runs])
            gpu = p.usage_of(p.gpu_device) if p.gpu_device else None
            rows.append({"n_gpu_layers": p.options["n_gpu_layers"], "gpu_layers": len(p.gpu_layers()),
                         "output_on_gpu": p.output_device != "cpu", "kv": "ram" if p.options["kv_offload"] else "gpu",
                         "batch": B, "repeat": args.repeat,
                         "prefill_tok_s": prefill["median"], "prefill_tok_s_min": prefill["min"],
                         "prefill_tok_s_max": prefill["max"], "decode_tok_s": decode["median"],
                         "decode_tok_s_min": decode["min"], "decode_tok_s_max": decode["max"],
                         "gpu_peak_bytes": _peak(p.gpu_device or ""), "gpu_planned_bytes": gpu.total if gpu else 0,
                         "gpu_budget_bytes": gpu.budget if gpu else 0,
                         "ram_planned_bytes": p.usage_of("cpu").total, "apply_s": apply_s,
                         "formats": sorted({lp.weight_format for lp in p.layers}),
                         # Triton launches per kernel in this batch's runs ({}: all torch)
                         "triton": {k: n - launched.get(k, 0) for k, n in triton_dispatch.calls.items()
                                    if n > launched.get(k, 0)}})
    finally:
        placement.undo()
        del runner
        gc.collect()
    return rows


def kv_blocks(batches: list[int], args) -> int:
    """Blocks for the largest batch (null block included), and at least the warm-up's two."""
    return max(max(batches) * math.ceil((args.prompt_tokens + args.gen_tokens) / 16) + 1, 3)


def recommend(rows: list[dict], budget_gib: float | None = None) -> dict | None:
    """The fastest row (median decode tok/s, then prefill) at the smallest batch whose GPU memory (measured
    peak or planned, the larger) fits budget_gib, or without it the planner's budget of the GPU swept."""
    if not rows:
        return None
    if budget_gib is not None:
        budget, source = budget_gib * GIB, f"--budget {budget_gib:g} GiB"
    else:
        budget = max(r["gpu_budget_bytes"] for r in rows)
        source = f"the planned budget of the GPU swept ({budget / GIB:.2f} GiB)" if budget else "no GPU budget"
    b = min(r["batch"] for r in rows)
    fit = [r for r in rows if r["batch"] == b and max(r["gpu_peak_bytes"], r["gpu_planned_bytes"]) <= budget]
    if not fit:
        return None
    best = max(fit, key=lambda r: (r["decode_tok_s"], r["prefill_tok_s"]))
    return {"n_gpu_layers": best["n_gpu_layers"], "kv_offload": best["kv"] == "ram",
            "decode_tok_s": best["decode_tok_s"], "prefill_tok_s": best["prefill_tok_s"],
            "gpu_bytes": max(best["gpu_peak_bytes"], best["gpu_planned_bytes"]), "budget_bytes": int(budget),
            "budget_source": source, "batch": b}


def print_table(rows: list[dict]) -> None:
    """Medians, with the [min-max] of the repeats."""
    print(f"{'ngl':>5} {'gpu':>4} {'out':>4} {'kv':>4} {'batch':>5} {'prefill/s [min-max]':>24} "
          f"{'decode/s [min-max]':>22} {'gpu peak':>9} {'gpu plan':>9} {'ram plan':>9}  formats (+triton: Triton ran)")
    for r in rows:
        pre = f"{r['prefill_tok_s']:.1f} [{r['prefill_tok_s_min']:.1f}-{r['prefill_tok_s_max']:.1f}]"
        dec = f"{r['decode_tok_s']:.2f} [{r['decode_tok_s_min']:.2f}-{r['decode_tok_s_max']:.2f}]"
        print(f"{r['n_gpu_layers']:>5} {r['gpu_layers']:>4} {'y' if r['output_on_gpu'] else 'n':>4} {r['kv']:>4} "
              f"{r['batch']:>5} {pre:>24} {dec:>22} {r['gpu_peak_bytes'] / GIB:>8.2f}G "
              f"{r['gpu_planned_bytes'] / GIB:>8.2f}G {r['ram_planned_bytes'] / GIB:>8.2f}G  "
              f"{','.join(r['formats'])}{' +triton' if r['triton'] else ''}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--device", default=None, help="cuda:0, ..., or cpu (torch's CPU device); default: first GPU")
    ap.add_argument("--devices-file", default=None,
                    help="JSON description of this machine's RAM and GPUs instead of probing (README, Offload)")
    ap.add_argument("--layers", default=None,
                    help="comma list of n_gpu_layers values (default 0, L/4, L/2, 3L/4, L, all)")
    ap.add_argument("--kv", default="gpu,ram", help="KV placements to try for GPU layers: gpu, ram or both")
    ap.add_argument("--batch", default="1,4", help="comma list of batch sizes")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3,
                    help="timed runs of each placement and batch (rows show the median and min-max)")
    ap.add_argument("--weight-dtype", default="auto", help="--gpu-weight-dtype for the GPU layers")
    ap.add_argument("--budget", type=float, default=None,
                    help="GiB of GPU memory the recommendation must fit (default: the planner's budget of the GPU)")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds: skip the configs left after this")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="JSON file to write (the PNG goes next to it)")
    ap.add_argument("--no-json", action="store_true")
    ap.add_argument("--no-chart", action="store_true")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")

    from engine.loading import configure_threads
    from engine.model.loader import load_model
    from offload import load_devices, model_meta, plan, probe_devices
    configure_threads(args.threads)
    t_start = time.perf_counter()
    model, cfg = load_model(args.model)
    meta = model_meta(model.weights)
    print(f"loaded {meta.name} ({meta.arch}, {meta.num_layers} layers, {meta.total_bytes / GIB:.2f} GiB) "
          f"in {time.perf_counter() - t_start:.1f} s")
    cpu_dev = args.device in ("cpu", "torch-cpu")
    devices = load_devices(args.devices_file) if args.devices_file else probe_devices(gpus=not cpu_dev)
    if not cpu_dev and not devices.gpus:
        print("no GPU found: sweeping on torch's CPU device (--device cpu)")
        cpu_dev = True
    batches = [int(b) for b in args.batch.split(",")]
    kv = [k.strip() for k in args.kv.split(",")]
    rows, skipped = [], []
    for ngl, kv_off in configs(layer_settings(args.layers, meta.num_layers), kv):
        label = f"n_gpu_layers={ngl}{' kv_offload' if kv_off else ''}"
        if args.time_limit and time.perf_counter() - t_start > args.time_limit:
            skipped.append(label)
            continue
        try:
            p = plan(meta, devices, n_gpu_layers=ngl, gpu_device="cpu" if cpu_dev else args.device,
                     kv_offload=kv_off, gpu_weight_dtype=args.weight_dtype, block_size=16,
                     max_model_len=args.prompt_tokens + args.gen_tokens + 16, max_num_seqs=max(batches),
                     max_num_batched_tokens=max(batches) * args.prompt_tokens,
                     num_gpu_blocks_override=kv_blocks(batches, args))
        except ValueError as e:
            print(f"{label}: does not fit ({e})")
            skipped.append(label)
            continue
        new = measure(model, p, args, batches, cfg.vocab_size)
        for r in new:
            print(f"{label} batch {r['batch']}: prefill {r['prefill_tok_s']:.1f} tok/s, decode "
                  f"{r['decode_tok_s']:.2f} tok/s (medians of {args.repeat}), GPU peak "
                  f"{r['gpu_peak_bytes'] / GIB:.2f} GiB, Triton "
                  f"{', '.join(f'{k} x{n}' for k, n in sorted(r['triton'].items())) or 'not used'}", flush=True)
        rows += new
    print()
    print_table(rows)
    rec = recommend(rows, args.budget)
    if rec:
        print(f"recommended within {rec['budget_source']}: --n-gpu-layers {rec['n_gpu_layers']}"
              f"{' --kv-offload' if rec['kv_offload'] else ''} (batch {rec['batch']}: decode "
              f"{rec['decode_tok_s']:.2f} tok/s, prefill {rec['prefill_tok_s']:.1f} tok/s, medians; GPU "
              f"{rec['gpu_bytes'] / GIB:.2f} GiB)")
    elif rows:
        print("nothing measured fits in " + (f"{args.budget:g} GiB" if args.budget is not None else "the GPU's budget"))
    if skipped:
        print("skipped: " + "; ".join(skipped))
    extra = {"model": args.model, "device": "torch-cpu" if cpu_dev else (args.device or devices.gpus[0].name),
             "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "repeat": args.repeat,
             "skipped": skipped}
    if not args.no_json:
        path = write_result("offload", {"rows": rows, "recommendation": rec}, extra, path=args.out)
        print(f"wrote {path}")
        if not args.no_chart and rows:
            png = chart(rows, os.path.splitext(path)[0] + ".png", f"{meta.name} on {extra['device']}")
            if png:
                print(f"wrote {png}")


if __name__ == "__main__":
    main()
