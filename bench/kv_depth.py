"""Decode at depth per KV cache dtype: one sequence's whole decode step (weights and attention) after --depth cached
tokens, llama-bench's `tg` at `-d`; the dtypes alternate round by round, medians:

    python -m bench.kv_depth --model M.gguf [--depth 8192] [--gen-tokens 32] [--dtypes fp16,int8] [--rounds 3]

The caches are filled through write_kv with random rows instead of a prefill (a step's cost does not depend on the
cached values, and an 8B-shaped prefill of 8k tokens takes minutes on 2 cores). One model, a runner per dtype.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from bench.common import median, write_result


def fill(runner, depth: int, block_ids: tuple, seed: int = 0) -> None:
    """Random K/V rows at positions 0..depth-1 of every paged layer."""
    from cpu_kernels import attention
    from cpu_kernels.kv_rows import head_dim
    rng = np.random.default_rng(seed)
    bs = runner.block_size
    pos = np.arange(depth)
    slots = np.asarray(block_ids, np.int64)[pos // bs] * bs + pos % bs
    for cache in runner.kv_caches:
        if cache is None or len(cache) != 2 or cache[0].ndim < 4:
            continue
        k_cache, v_cache = cache
        shape = (depth, k_cache.shape[2], head_dim(k_cache))
        attention.write_kv(rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32),
                           k_cache, v_cache, slots)


def main(argv=None) -> None:
    from cpu_kernels.quant import configure_threads
    from engine.model.loader import load_model
    from engine.worker.runner import ModelRunner, SeqChunk
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--depth", type=int, default=8192)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--dtypes", default="fp16,int8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    configure_threads(a.threads)
    model, cfg = load_model(a.model)
    nb = -(-(a.depth + a.gen_tokens) // a.block_size)
    block_ids = tuple(range(1, nb + 1))  # block 0 is the engine's null block
    runners = {}
    for name in a.dtypes.split(","):
        runners[name] = ModelRunner(model, num_blocks=nb + 1, block_size=a.block_size, kv_cache_dtype=name)
        fill(runners[name], a.depth, block_ids)
    times = {name: [] for name in runners}
    for r in range(a.rounds + 1):
        for name, runner in runners.items():
            tok = 1
            t0 = time.perf_counter()
            for i in range(a.gen_tokens):
                logits = runner.execute([SeqChunk((tok,), a.depth + i, block_ids, "last")])[0]
                tok = int(np.argmax(logits[-1]))
            if r:  # round 0 compiles and warms
                times[name].append(a.gen_tokens / (time.perf_counter() - t0))
    base = a.dtypes.split(",")[0]
    # each round's ratio to the first dtype's run beside it: the host's speed swings between rounds, less within one
    figures = {name: {"tok_s": median(t), "runs": t,
                      "round_ratio": median([x / y for x, y in zip(t, times[base])])} for name, t in times.items()}
    print(f"{a.model}: decode at depth {a.depth}, {a.gen_tokens} tokens: " + ", ".join(
        f"{name} {f['tok_s']:.2f} tok/s ({f['tok_s'] / figures[base]['tok_s']:.2f}x; median of rounds' ratios "
        f"{f['round_ratio']:.2f}x)" for name, f in figures.items()))
    print(f"wrote {write_result('kv-depth', figures, vars(a))}")


if __name__ == "__main__":
    main()
