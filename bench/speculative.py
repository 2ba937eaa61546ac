"""Speculative decoding's gain: greedy decode tok/s with drafts (n-gram; suffix, with and without its tree of recent
outputs, which learns the set's answers over the rounds) against the same engine without them, on input-grounded chats
(bench/spec_prompts.py), one request and 16 at a time, alternating rounds, medians; and the cost of a q-row
verification step (q = 1..8) against a 1-row decode step at a given context depth:

    python -m bench.speculative [--model M] [--methods ngram,suffix,suffix-nocache] [--k 4] [--lookup 1,3]
                                [--rounds 3] [--gen-tokens 128]
    python -m bench.speculative --step-cost [--model M] [--depth 512]
"""
from __future__ import annotations

import argparse
import time

from bench.common import median, write_result


def _gain(a) -> dict:
    from bench.spec_prompts import PROMPTS
    from engine import LLM, SamplingParams
    lo, hi = (int(v) for v in a.lookup.split(","))
    configs = {"ngram": {"method": "ngram", "num_speculative_tokens": a.k, "prompt_lookup_min": lo,
                         "prompt_lookup_max": hi},
               "suffix": {"method": "suffix", "num_speculative_tokens": a.k},
               "suffix-nocache": {"method": "suffix", "num_speculative_tokens": a.k,
                                  "suffix_decoding_max_cached_requests": 0}}
    methods = a.methods.split(",")
    kw = dict(model=a.model, max_model_len=2048, kv_cache_memory=a.kv_gib)
    engines = {"plain": LLM(**kw), **{m: LLM(speculative_config=configs[m], **kw) for m in methods}}
    for llm in engines.values():
        llm.llm_engine.import_torch_now()
    params = SamplingParams(temperature=0.0, max_tokens=a.gen_tokens)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    figures = {"configs": {m: configs[m] for m in methods}}
    for n in (int(c) for c in a.concurrency.split(",")):
        runs, texts = {k: [] for k in engines}, {}
        for r in range(a.rounds + 1):
            for k, llm in engines.items():
                t0 = time.perf_counter()
                if n == 1:  # every chat of the set, one after another
                    outs = [llm.chat([c], params, use_tqdm=False)[0] for c in chats]
                else:
                    outs = llm.chat([chats[i % len(chats)] for i in range(n)], params, use_tqdm=False)
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
                texts[k] = [o.outputs[0].text for o in outs]
                if r:  # round 0 warms
                    runs[k].append(tokens / (time.perf_counter() - t0))
        plain = median(runs["plain"])
        figures[f"concurrency_{n}"] = {"plain_tok_s": plain, "runs": runs}
        for m in methods:
            tok_s, same = median(runs[m]), texts["plain"] == texts[m]
            figures[f"concurrency_{n}"][m] = {"tok_s": tok_s, "ratio": tok_s / plain, "same_text": same}
            print(f"{n} at a time: plain {plain:.1f} tok/s, {m} {tok_s:.1f} tok/s ({tok_s / plain:.2f}x), "
                  f"same text: {same}")
    for m in methods:
        st = engines[m].llm_engine.spec_stats
        figures[f"acceptance_{m}"] = {"drafts": st.num_drafts, "draft_tokens": st.num_draft_tokens,
                                      "accepted": st.num_accepted_tokens, "rate": st.acceptance_rate,
                                      "per_position": st.accepted_per_pos}
        print(f"{m}: accepted {st.num_accepted_tokens} of {st.num_draft_tokens} draft tokens "
              f"({st.acceptance_rate:.0%}); per position {st.accepted_per_pos}")
    return figures


def _step_cost(a) -> dict:
    """Seconds of one step running q rows of one sequence at depth `depth` (a decode step is q = 1), medians."""
    from engine import LLM
    from engine.worker.runner import SeqChunk
    llm = LLM(model=a.model, max_model_len=a.depth + 16, kv_cache_memory=a.kv_gib)
    runner = llm.llm_engine.runner
    bs = runner.block_size
    blocks = tuple(range(1, 2 + (a.depth + 8) // bs))
    runner.execute_hidden([SeqChunk((1,) * a.depth, 0, blocks, "none")])  # fills the context's KV
    times = {}
    for r in range(a.rounds + 1):
        for q in range(1, 9):
            t0 = time.perf_counter()
            hidden = runner.execute_hidden([SeqChunk((1,) * q, a.depth, blocks, "all")])
            runner.compute_logits(hidden[0], per_row=True)
            if r:
                times.setdefault(q, []).append(time.perf_counter() - t0)
    one = median(times[1])
    figures = {f"rows_{q}": {"ms": median(t) * 1e3, "vs_1_row": median(t) / one} for q, t in times.items()}
    print("rows: " + ", ".join(f"{q}: {median(t) * 1e3:.1f} ms ({median(t) / one:.2f}x)" for q, t in times.items()))
    return figures


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--methods", default="ngram", help="comma-separated: ngram, suffix, suffix-nocache")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--lookup", default="1,3", help="prompt_lookup_min,prompt_lookup_max")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--step-cost", action="store_true", help="measure q-row verification steps instead")
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--kv-gib", type=float, default=1.0)
    a = ap.parse_args(argv)
    figures = _step_cost(a) if a.step_cost else _gain(a)
    print(f"wrote {write_result('speculative-step' if a.step_cost else 'speculative', figures, vars(a))}")


if __name__ == "__main__":
    main()
