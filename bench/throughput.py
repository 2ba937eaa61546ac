"""Engine throughput with no HTTP: N concurrent requests through LLMEngine, continuously batched.

    python -m bench.throughput [--model M] [--concurrency 1 4 16] [--max-tokens 128] [--threads N]

For each concurrency N, N requests arrive together; prints total generated tokens/s and the median
and worst time to first token, and writes JSON to bench/results/.
"""
from __future__ import annotations

import argparse
import time

from bench.common import median, write_result

PROMPTS = ["Write a short story about a robot who learns to paint.", "Explain how a rainbow forms.",
           "List ten uses for a paperclip.", "Describe the city of Paris in spring.",
           "What makes a good friend?", "Summarize the plot of a detective novel you invent."]


def run(llm, n: int, max_tokens: int) -> dict:
    from engine import SamplingParams
    eng = llm.llm_engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    for i in range(n):
        eng.add_request(f"r{i}", PROMPTS[i % len(PROMPTS)] + f" (variant {i})", params)
    first: dict[str, float] = {}
    generated = 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            first.setdefault(out.request_id, time.perf_counter() - t0)
            if out.finished:
                generated += len(out.outputs[0].token_ids)
    wall = time.perf_counter() - t0
    ttft = sorted(first.values())
    return {"concurrency": n, "generated_tok_s": generated / wall, "ttft_median_s": median(ttft),
            "ttft_max_s": ttft[-1], "wall_s": wall}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    from engine import LLM
    llm = LLM(model=args.model, num_threads=args.threads, max_model_len=1024, kv_cache_memory=2.0)
    run(llm, 2, 4)  # warm-up
    llm.llm_engine.import_torch_now()  # not in the timed steps
    results = []
    for n in args.concurrency:
        r = run(llm, n, args.max_tokens)
        results.append(r)
        print(f"concurrency {n:3d}: {r['generated_tok_s']:7.1f} generated tok/s, TTFT median "
              f"{r['ttft_median_s']:.3f} s, max {r['ttft_max_s']:.3f} s")
    path = write_result("throughput", {f"c{r['concurrency']}_tok_s": r["generated_tok_s"] for r in results},
                        {"model": llm.model_path, "runs": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
