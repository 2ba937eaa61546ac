"""Perplexity by llama.cpp's llama-perplexity protocol (-c 512 -b 512), computed through prompt_logprobs.

Tokenize the whole text once with BOS, cut it into floor(n / ctx) chunks of ctx tokens, replace each
chunk's first token by BOS, run each chunk as a fresh sequence and score the second half only.

    python -m bench.perplexity [--model M] [--text FILE] [--ctx 512] [--json OUT] [--prefill-dtype bfloat16]
                               [--kv-cache-dtype fp8]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

REFERENCE_TEXT = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "reference", "texts", "gpl-3.txt")


def perplexity(llm, text: str, ctx: int = 512, max_chunks: int | None = None) -> dict:
    """Returns {'ppl', 'count', 'chunks', 'seconds'} following llama-perplexity's scoring."""
    from engine import SamplingParams
    tok = llm.get_tokenizer()
    ids = tok.encode(text)  # BOS prepended, as the protocol says
    n_chunks = len(ids) // ctx if max_chunks is None else min(max_chunks, len(ids) // ctx)
    bos = tok.bos_token_id
    prompts = []
    for c in range(n_chunks):
        chunk = list(ids[c * ctx:(c + 1) * ctx])
        chunk[0] = bos
        prompts.append({"prompt_token_ids": chunk})
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    total, count = 0.0, 0
    first = ctx // 2
    for prompt, out in zip(prompts, outs):
        toks = prompt["prompt_token_ids"]
        # prompt_logprobs[j] scores token j given tokens 0..j-1; llama.cpp scores j+1 for j = first .. ctx-2.
        for j in range(first + 1, ctx):
            total -= out.prompt_logprobs[j][toks[j]].logprob
            count += 1
    return {"ppl": math.exp(total / count), "count": count, "chunks": n_chunks, "seconds": seconds,
            "tokens": n_chunks * ctx}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--text", default=REFERENCE_TEXT)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--json", default=None)
    ap.add_argument("--prefill-dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    ap.add_argument("--kv-cache-dtype", default="auto", help="e.g. fp8: the cache's effect on perplexity")
    args = ap.parse_args(argv)
    from engine import LLM
    llm = LLM(model=args.model, prefill_dtype=args.prefill_dtype, kv_cache_dtype=args.kv_cache_dtype)
    with open(args.text, encoding="utf-8") as f:
        res = perplexity(llm, f.read(), args.ctx)
    res["model"], res["kv_cache_dtype"] = llm.model_path, args.kv_cache_dtype
    print(f"perplexity {res['ppl']:.4f} over {res['count']} tokens ({res['chunks']} chunks of {args.ctx}), "
          f"{res['tokens'] / res['seconds']:.1f} tok/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
