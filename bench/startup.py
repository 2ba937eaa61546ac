"""Start to first token as a user sees it: a fresh `ramlm generate` process, timed until its first text.

    python -m bench.startup [--model M] [--rounds 5]          # warm: the JIT and tokenizer caches exist
    python -m bench.startup --cold [--rounds 1]               # cold: each round gets an empty cache dir

The clock starts before the process is spawned (interpreter start and imports count) and stops when
the first generated text reaches its stdout. Warm rounds share one cache dir, filled by an untimed run
first; cold rounds each point RAMLM_CACHE_DIR at a new empty folder, as on a fresh machine.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench.common import median, write_result

PROMPT = "The capital of France is"


def time_to_first_text(model: str | None, cache_dir: str, timeout: float = 600.0) -> float:
    cmd = [sys.executable, "-m", "engine.entrypoints.cli", "generate", PROMPT, "--max-tokens", "2"]
    if model:
        cmd += ["--model", model]
    env = dict(os.environ, RAMLM_CACHE_DIR=cache_dir)
    env.pop("NUMBA_CACHE_DIR", None)  # it would override RAMLM_CACHE_DIR for the kernels
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = None
    while True:
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        if first is None and chunk.strip():
            first = time.perf_counter() - t0
    err = proc.communicate(timeout=timeout)[1]
    if proc.returncode != 0 or first is None:
        raise RuntimeError(f"ramlm generate failed (exit {proc.returncode}): {err.decode()[-2000:]}")
    return first


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=None, help="default 5 warm, 1 cold")
    ap.add_argument("--cold", action="store_true", help="empty JIT and tokenizer caches every round")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.cold else 5)
    times = []
    shared = tempfile.mkdtemp(prefix="ramlm-startup-")
    try:
        if not args.cold:
            time_to_first_text(args.model, shared)  # fills the caches, untimed
        for i in range(rounds):
            cache = tempfile.mkdtemp(prefix="ramlm-cold-") if args.cold else shared
            try:
                times.append(time_to_first_text(args.model, cache))
            finally:
                if args.cold:
                    shutil.rmtree(cache, ignore_errors=True)
            print(f"round {i + 1}: {times[-1]:.2f} s to first token", flush=True)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    kind = "cold" if args.cold else "warm"
    print(f"{kind} start to first token: median {median(times):.2f} s over {rounds} "
          f"(min {min(times):.2f}, max {max(times):.2f})")
    path = write_result(f"startup-{kind}", {f"{kind}_ttft_median_s": median(times), f"{kind}_ttft_min_s": min(times)},
                        {"model": args.model, "rounds": times})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
