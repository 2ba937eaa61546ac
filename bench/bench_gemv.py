"""Decode GEMV (M = 1) per weight format, against numpy's float32 GEMV on the same shape.

    python bench/bench_gemv.py                        # every format at 4096 x 4096, Q8_0 at 262144 x 640
    python bench/bench_gemv.py --formats Q8_0 Q4_K --reps 30 --json bench/results/gemv.json
    python bench/bench_gemv.py --threads 1        # one core for both (steadier on a shared machine)
    python bench/bench_gemv.py --formats Q4_K Q6_K --rows 1,3,4,5,8   # a speculative check's / a small batch's rows

Prints one line per (format, shape): median and best us/call, GB/s of GGUF weight bytes at the
median, and the numpy float32 GEMV time measured alternately with it (the machine is shared, so
only same-run ratios mean much). Weights are a small quantized random matrix tiled to N rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if "--threads" in sys.argv:  # thread counts must be set before numpy's BLAS and Numba load
    _n = sys.argv[sys.argv.index("--threads") + 1]
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["NUMBA_NUM_THREADS"] = _n

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

from cpu_kernels.quant import FORMATS, QuantLinear, configure_threads, quantize  # noqa: E402


def tiled_raw(t, N, K, seed=0):
    rows = min(N, 256)
    w = np.random.default_rng(seed).standard_normal((rows, K)).astype(np.float32)
    raw = quantize(t, w)
    return np.ascontiguousarray(np.tile(raw, (N // rows + 1, 1))[:N])


def timed(fn, n):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def bench(t, N, K, reps, with_numpy=True, rows=1):
    raw = tiled_raw(t, N, K)
    lin = QuantLinear.from_raw(t, raw, (N, K))
    x = np.random.default_rng(1).standard_normal((rows, K)).astype(np.float32)
    out = np.empty((rows, N), np.float32)
    lin.matmul(x, out=out)
    wf = np.random.default_rng(2).standard_normal((N, K)).astype(np.float32) if with_numpy else None
    tk, tn = [], []
    # Alternate in rounds of 5 calls, dropping each round's first: OpenBLAS's and Numba's OpenMP
    # thread pools spin after use, and switching between them on every call costs milliseconds.
    for _ in range(max(1, reps // 4)):
        tk += timed(lambda: lin.matmul(x, out=out), 5)[1:]
        if with_numpy:
            tn += timed(lambda: x @ wf.T, 5)[1:]
    med = float(np.median(tk))
    res = {"format": t.name, "N": N, "K": K, "rows": rows, "us": med * 1e6, "best_us": min(tk) * 1e6,
           "gguf_bytes": raw.nbytes, "repacked_bytes": lin.nbytes, "GB_s": raw.nbytes / med / 1e9}
    if with_numpy:
        res["numpy_f32_us"] = float(np.median(tn)) * 1e6
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", nargs="*", default=None, help="format names (default: all)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--size", type=int, default=4096, help="N = K of the square case")
    ap.add_argument("--no-output-shape", action="store_true", help="skip the 262144 x 640 Q8_0 case")
    ap.add_argument("--threads", type=int, default=None, help="threads for the kernels and numpy (default: all)")
    ap.add_argument("--rows", default="1", help="activation rows per call, comma-separated (numpy's GEMV: rows = 1)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    configure_threads()
    names = args.formats or [t.name for t in FORMATS]
    by_name = {t.name: t for t in FORMATS}  # GGML's types and ramlm's own (FP8_E4M3, U8_ZP)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        ap.error(f"unknown formats {unknown} (known: {', '.join(by_name)})")
    cases = [(by_name[n], args.size, args.size) for n in names]
    if not args.no_output_shape:
        cases.append((Q.Q8_0, 262144, 640))
    results = []
    for t, N, K in cases:
        for rows in (int(m) for m in args.rows.split(",")):
            r = bench(t, N, K, args.reps, with_numpy=rows == 1 and N * K <= 64 * 2**20, rows=rows)
            results.append(r)
            np_part = f"  numpy f32 {r['numpy_f32_us']:8.0f} us ({r['numpy_f32_us'] / r['us']:4.1f}x)" \
                if "numpy_f32_us" in r else ""
            print(f"{r['format']:5s} {N:6d}x{K:<5d} rows {rows:2d} {r['us']:8.0f} us (best {r['best_us']:6.0f})"
                  f" {r['GB_s']:6.1f} GB/s{np_part}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
