"""Decode speed of two or more models loaded in one process, round by round in turn: on a shared host whose memory
speed swings between minutes, models measured in separate processes are not comparable, models measured side by side
are (an FP8 folder against the Q8_0 GGUF of its shape, say).

    python -m bench.decode_ab --model A --model B [--rounds 7] [--gen-tokens 32] [--threads N]

Prints each model's median decode tok/s (bench.speed's measure: tokens after the first over the time from the first
to the last, an 8-token prompt) and, against the first model, the ratio of medians and the median of each round's own
ratio; the first round (pages faulted in) is not counted. The models must fit in RAM together.
"""
from __future__ import annotations

import argparse

from bench.common import median, write_result
from bench.speed import run


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="a model; give two or more")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-json", action="store_true")
    args = ap.parse_args(argv)
    if len(args.model) < 2:
        ap.error("give two or more --model")
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the first is not counted)")
    from engine import LLM
    llms = []
    for m in args.model:
        llm = LLM(model=m, num_threads=args.threads, enable_prefix_caching=False,
                  max_model_len=max(128, args.gen_tokens + 64),
                  kv_cache_memory=0.5)
        run(llm, 32, 4, 1)  # compiles or loads every kernel signature once
        llms.append(llm)
    runs: list[list[float]] = [[] for _ in llms]
    for r in range(args.rounds):
        for i, llm in enumerate(llms):
            runs[i].append(run(llm, 8, args.gen_tokens + 1, 1, only="decode")["decode_tok_s"])
        note = " (not counted)" if r == 0 else ""
        print(f"round {r}: " + ", ".join(f"{t[-1]:.2f}" for t in runs) + " tok/s" + note, flush=True)
    counted = [t[1:] for t in runs]
    figures = {m: {"tok_s": median(t), "ratio": median(t) / median(counted[0]),
                   "round_ratio": median([x / y for x, y in zip(t, counted[0])]), "runs": runs[i]}
               for i, (m, t) in enumerate(zip(args.model, counted))}
    for m, f in figures.items():
        print(f"{m}: {f['tok_s']:.2f} tok/s ({f['ratio']:.3f}x the first; median of rounds' ratios "
              f"{f['round_ratio']:.3f}x)")
    if not args.no_json:
        print("wrote " + write_result("decode-ab", figures, {"threads": args.threads, "gen_tokens": args.gen_tokens}))


if __name__ == "__main__":
    main()
