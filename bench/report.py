"""Builds the README's benchmark table from the newest JSON of each bench in bench/results/.

    python -m bench.report [--write]     # prints the table; --write replaces it in README.md
"""
from __future__ import annotations

import argparse
import glob
import json
import os

from bench.common import RESULTS

README = os.path.join(os.path.dirname(__file__), "..", "README.md")
BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


# Results of the Intel Xeon with AMX written before bench.common.isa() had the amx label (2026-12-05, to 13:05 UTC).
_AMX_BEFORE_LABEL = ("20261205T", "20261205T1305")


def result_isa(d: dict) -> str:
    # Results written before the field existed all came from AVX-512 VNNI (Zen 4) machines.
    m = d.get("machine", {})
    isa = m.get("isa", "avx512-vnni")
    early_amx = "Intel" in str(m.get("cpu", "")) and _AMX_BEFORE_LABEL[0] <= str(d.get("time", "")) < _AMX_BEFORE_LABEL[1]
    return "avx512-amx" if isa == "avx512-vnni" and early_amx else isa


def latest() -> dict[str, dict]:
    newest: dict[str, dict] = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        key = f"{d.get('bench', '?')} {os.path.basename(str(d.get('model') or 'default'))} {result_isa(d)}"
        if key not in newest or d.get("time", "") >= newest[key].get("time", ""):
            newest[key] = d
    return newest


def rows(results: dict[str, dict]) -> list[str]:
    out = ["| bench | model | cpu | figures | git | when |", "| --- | --- | --- | --- | --- | --- |"]
    for key in sorted(results):
        d = results[key]
        fig = d.get("figures", {})
        parts = []
        for k, v in fig.items():
            if isinstance(v, dict):
                parts.append(f"{k}: " + ", ".join(f"{kk} {vv:.2f}" for kk, vv in v.items() if isinstance(vv, float)))
            elif isinstance(v, float):
                parts.append(f"{k} {v:.2f}")
            elif isinstance(v, int):
                parts.append(f"{k} {v}")
        model = "-" if d.get("bench") == "peak" else os.path.basename(str(d.get("model") or "gemma-3-270m-q4_k_m.gguf"))
        out.append(f"| {d.get('bench')} | {model} | {result_isa(d)} | {'; '.join(parts)} | {d.get('git', '')} "
                   f"| {d.get('time', '')} |")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    table = "\n".join(rows(latest()))
    print(table)
    if args.write:
        with open(README) as f:
            text = f.read()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            text = f"{head}{BEGIN}\n{table}\n{END}{tail}"
            with open(README, "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
