"""`ramlm plan [MODEL] [--devices-file FILE] [--json]`: the placement plan for a model on a machine, and why.

MODEL is a GGUF file or HF folder (only the header is read: no weights are loaded), or --shape NAME
plans a synthetic model of a known shape (offload.meta.SHAPES) in --quant, without any file.
"""
from __future__ import annotations

import argparse
import sys


def add_plan_args(p: argparse.ArgumentParser) -> None:
    from engine.args import EngineArgs
    p.add_argument("model", nargs="?", default=None, help="GGUF file or HF folder (default: the embedded model)")
    p.add_argument("--shape", default=None, help="plan a synthetic model instead: llama-8b, qwen3-moe-30b-a3b, ...")
    p.add_argument("--quant", default="q4_k_m", help="quantization of the --shape model (q4_k_m, q8_0, f16, ...)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    EngineArgs.add_cli_args(p, skip=("model",))


def _meta(ns):
    from offload.meta import SHAPES, model_meta_from_path, synthetic_meta
    if ns.shape:
        if ns.shape not in SHAPES:
            raise ValueError(f"unknown --shape {ns.shape!r}; known: {', '.join(SHAPES)}")
        return synthetic_meta(ns.shape, ns.quant)
    from engine.args import EngineArgs
    return model_meta_from_path(ns.model or EngineArgs().resolved_model())


def build_plan(ns):
    from engine.args import EngineArgs
    from offload import load_devices, plan, probe_devices
    args = EngineArgs.from_cli_args(ns)
    # A described machine need not be this one: its GPUs are planned for, not looked for.
    devices = load_devices(ns.devices_file, on_this_machine=False) if ns.devices_file else probe_devices()
    return plan(_meta(ns), devices, args)


def elsewhere_note(tensors_elsewhere: dict) -> str:
    """{"blk.3.ffn_up_exps.weight": "cpu", ...} -> "ffn_down_exps, ffn_gate_exps, ffn_gate_inp, ffn_up_exps in RAM"."""
    by_device: dict[str, set] = {}
    for name, dev in tensors_elsewhere.items():
        by_device.setdefault(dev, set()).add(name.split(".")[2])
    return "; ".join(f"{', '.join(sorted(leaves))} {'in RAM' if dev == 'cpu' else 'on ' + dev}"
                     for dev, leaves in sorted(by_device.items()))


def format_plan(p) -> str:
    from offload.plan_types import gib
    from offload.sizes import ranges
    lines = [f"plan for {p.model} ({p.arch}, {p.num_layers} layers)"]
    groups: dict[tuple, list[int]] = {}
    for lp in p.layers:
        key = (lp.device, lp.weights, lp.weight_format, lp.kv_device, elsewhere_note(lp.tensors_elsewhere))
        groups.setdefault(key, []).append(lp.index)
    lines.append(f"  {'layers':<14} {'device':<10} {'weights':<9} {'format':<9} {'kv':<10} note")
    for (dev, home, fmt, kv, note), ix in groups.items():
        lines.append(f"  {ranges(ix):<14} {dev:<10} {home:<9} {fmt:<9} {kv:<10} {note}".rstrip())
    lines.append(f"  embedding: {p.embed_device}; output matrix: {p.output_device} ({p.output_format})")
    lines.append(f"  KV: {p.kv.num_blocks} blocks x {p.kv.block_size} tokens ({p.kv.dtype}), limited by "
                 f"{p.kv.limited_by}" + (f"; RAM tier {p.kv.num_cpu_blocks} blocks" if p.kv.num_cpu_blocks else ""))
    lines.append(f"  {'memory':<10} {'weights':>11} {'kv':>11} {'work':>11} {'margin':>11} {'total':>11} "
                 f"{'budget':>11}")
    for u in p.usage:
        lines.append(f"  {u.device:<10} " + " ".join(f"{gib(v):>11}" for v in
                                                     (u.weights, u.kv, u.work, u.margin, u.total, u.budget)))
    lines.append("why:")
    lines += [f"  - {r}" for r in p.reasons]
    if p.warnings:
        lines.append("warnings:")
        lines += [f"  ! {w}" for w in p.warnings]
    return "\n".join(lines)


def run_plan(ns) -> int:
    p = build_plan(ns)
    print(p.to_json() if ns.json else format_plan(p))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ramlm plan", description=__doc__)
    add_plan_args(ap)
    return run_plan(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
