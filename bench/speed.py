"""Prefill and decode speed of one sequence through the engine (no HTTP).

    python -m bench.speed [--model M] [--prompt-tokens 512] [--gen-tokens 128] [--repeats 3] [--threads N]

Prefill: tokens/s over a prompt of --prompt-tokens (prefix caching off, so every run computes it all).
Decode: tokens/s generating --gen-tokens after a short prompt (time after the first token).
Prints one line of medians and writes JSON to bench/results/.
"""
from __future__ import annotations

import argparse
import time

from bench.common import median, write_result


def run(llm, prompt_tokens: int, gen_tokens: int, repeats: int, only: str = "both") -> dict:
    from engine import SamplingParams
    tok = llm.get_tokenizer()
    # A fixed pseudo-text long enough for any prompt length: distinct ids, no special tokens.
    base = tok.encode("The quick brown fox jumps over the lazy dog. " * 200, add_special_tokens=False)
    prompt = [tok.bos_token_id] + base[: prompt_tokens - 1]
    pp, tg, ttft = [], [], []
    for _ in range(repeats):
        if only != "decode":
            t0 = time.perf_counter()
            llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
            pp.append(len(prompt) / (time.perf_counter() - t0))
        if only == "prefill":
            continue
        short = prompt[:8]
        t0 = time.perf_counter()
        first = None
        for out in llm.generate_stream({"prompt_token_ids": short},
                                       SamplingParams(max_tokens=gen_tokens, temperature=0, ignore_eos=True)):
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        ttft.append(first - t0)
        tg.append((gen_tokens - 1) / (end - first))
    nan = float("nan")
    return {"prefill_tok_s": median(pp) if pp else nan, "decode_tok_s": median(tg) if tg else nan,
            "ttft_short_s": median(ttft) if ttft else nan,
            "prefill_runs": pp, "decode_runs": tg, "prompt_tokens": len(prompt), "gen_tokens": gen_tokens}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-json", action="store_true")
    ap.add_argument("--only", choices=["both", "prefill", "decode"], default="both")
    ap.add_argument("--batch-invariant", action="store_true", help="measure the batch_invariant mode")
    ap.add_argument("--prefill-dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    args = ap.parse_args(argv)
    from engine import LLM
    t0 = time.perf_counter()
    llm = LLM(model=args.model, num_threads=args.threads, enable_prefix_caching=False,
              batch_invariant=args.batch_invariant, prefill_dtype=args.prefill_dtype,
              max_model_len=max(1024, args.prompt_tokens + 16), kv_cache_memory=1.0)
    load_s = time.perf_counter() - t0
    # Warm-up: compiles or loads every kernel signature once.
    run(llm, 32, 4, 1)
    llm.llm_engine.import_torch_now()  # not in the timed runs
    res = run(llm, args.prompt_tokens, args.gen_tokens, args.repeats, args.only)
    res["load_s"] = load_s
    print(f"model {llm.model_path.rsplit('/', 1)[-1]}: prefill {res['prefill_tok_s']:.1f} tok/s "
          f"(pp{res['prompt_tokens']}), decode {res['decode_tok_s']:.1f} tok/s (tg{args.gen_tokens}), "
          f"load {load_s:.2f} s, median of {args.repeats}")
    if not args.no_json:
        name = (args.only if args.only != "both" else "speed") + ("-batch-invariant" if args.batch_invariant else "") \
            + ("" if args.prefill_dtype == "auto" else "-" + args.prefill_dtype)
        path = write_result(name, res, {"model": llm.model_path, "threads": args.threads,
                                                 "prefill_dtype": args.prefill_dtype})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
