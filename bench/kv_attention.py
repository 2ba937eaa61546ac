"""Decode attention over a long context, one layer at a time, per KV cache dtype (the kernel alone: the figure a
quantized KV cache changes), alternating the dtypes, medians:

    python -m bench.kv_attention [--context 8192] [--heads 32 --kv-heads 8 --head-dim 128] [--dtypes fp16,fp8,int8]

Each round runs one decode row over 4 layers' caches (more than the last-level cache holds, as a real step does).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from bench.common import median, write_result


def main(argv=None) -> None:
    from cpu_kernels import attention
    from engine.core.kv_spec import LayerKV
    from engine.worker.runner import layer_cache
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtypes", default="fp16,fp8")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args(argv)
    ctx, bs, hkv, d = a.context, a.block_size, a.kv_heads, a.head_dim
    nb = -(-ctx // bs)
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((ctx, hkv, d)).astype(np.float32)
    q = rng.standard_normal((1, a.heads, d)).astype(np.float32)
    meta = (np.array([0, 1], np.int32), np.array([ctx], np.int32), np.arange(nb, dtype=np.int32)[None])
    caches = {}
    for name in a.dtypes.split(","):
        layers = []
        for _ in range(4):
            k, v = layer_cache(LayerKV(hkv, d), nb, bs, name)
            attention.write_kv(kv, kv, k, v, np.arange(ctx, dtype=np.int64))
            layers.append((k, v))
        caches[name] = layers
    times = {name: [] for name in caches}
    for r in range(a.rounds + 1):
        for name, layers in caches.items():
            t0 = time.perf_counter()
            for k, v in layers:
                attention.paged_attention(q, k, v, *meta, 1.0 / np.sqrt(d))
            if r:  # round 0 compiles
                times[name].append((time.perf_counter() - t0) / len(layers) * 1e3)
    figures = {name: {"ms_per_layer": median(t), "runs": t} for name, t in times.items()}
    print(f"context {ctx}, {a.heads}/{hkv} heads of {d}: " + ", ".join(
        f"{name} {f['ms_per_layer']:.2f} ms per layer" for name, f in figures.items()))
    print(f"wrote {write_result('kv-attention', figures, vars(a))}")


if __name__ == "__main__":
    main()
