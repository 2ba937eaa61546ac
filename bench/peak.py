"""The machine's ceilings that bound the targets: memory read bandwidth, bf16 GEMM and int8 dot-product peaks.

    python -m bench.peak [--threads 2]

- read_gb_s: a Numba prange sum over 1 GiB of float32 (decode reads every weight once per token);
- bf16_gemm_gflop_s / f32_gemm_gflop_s: torch (oneDNN) 2048^3 matmuls, the prefill path's engine;
- int8_dot_gop_s: vpdpbusd on 8 independent register chains per thread (2 ops per multiply-add), the most
  any int8 kernel here can reach (AVX-512 VNNI hosts; AVX2 hosts run dot.py's emulation).
Medians of several runs; writes JSON to bench/results/.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit, prange

from bench.common import median, write_result


@njit(parallel=True, fastmath=True, cache=True)
def _sum(a):
    t = 0.0
    for i in prange(a.shape[0]):
        t += a[i]
    return t


def read_bandwidth(repeats: int = 7) -> float:
    a = np.ones(1 << 28, np.float32)
    _sum(a)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _sum(a)
        times.append(time.perf_counter() - t0)
    return a.nbytes / median(times) / 1e9


def gemm_peak(dtype: str, n: int = 2048, repeats: int = 7) -> float:
    import torch
    a = torch.randn(n, n).to(getattr(torch, dtype))
    b = torch.randn(n, n).to(getattr(torch, dtype))
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / median(times) / 1e9


def _int8_kernel():
    from cpu_kernels.quant.dot import dpbusd
    from cpu_kernels.quant.simd import load_u8x32, store, to_f32, vadd
    from cpu_kernels.quant.simd_lanes import splat_i32

    @njit(parallel=True)
    def chains(w, n, nthreads, out):
        for p in prange(nthreads):
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = splat_i32(0)
            x, y = load_u8x32(w, 32), load_u8x32(w, 0)
            for _ in range(n):
                a0, a1, a2, a3 = dpbusd(a0, x, y), dpbusd(a1, y, x), dpbusd(a2, x, x), dpbusd(a3, y, y)
                a4, a5, a6, a7 = dpbusd(a4, x, y), dpbusd(a5, y, x), dpbusd(a6, x, x), dpbusd(a7, y, y)
            s = vadd(vadd(vadd(a0, a1), vadd(a2, a3)), vadd(vadd(a4, a5), vadd(a6, a7)))
            store(out, 8 * p, to_f32(s))  # used, so the loop stays
        return out
    return chains


def int8_peak(nthreads: int, n: int = 20_000_000, repeats: int = 5) -> float:
    chains = _int8_kernel()
    w = np.arange(64, dtype=np.uint8)
    out = np.zeros(8 * nthreads, np.float32)
    chains(w, 10, nthreads, out)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        chains(w, n, nthreads, out)
        times.append(time.perf_counter() - t0)
    return nthreads * n * 8 * 32 * 2 / median(times) / 1e9  # 8 vpdpbusd of 32 multiply-adds per iteration


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-json", action="store_true")
    args = ap.parse_args(argv)
    import numba
    import torch
    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    res = {"read_gb_s": read_bandwidth(), "bf16_gemm_gflop_s": gemm_peak("bfloat16"),
           "f32_gemm_gflop_s": gemm_peak("float32"), "int8_dot_gop_s": int8_peak(args.threads)}
    print(", ".join(f"{k} {v:.1f}" for k, v in res.items()) + f" ({args.threads} threads, medians)")
    if not args.no_json:
        print(f"wrote {write_result('peak', res, {'threads': args.threads})}")


if __name__ == "__main__":
    main()
