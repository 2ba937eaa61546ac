"""Speculative decoding's gain: greedy decode tok/s with n-gram drafts against the same engine without them, on
input-grounded chats (bench/spec_prompts.py), one request and 16 at a time, alternating rounds, medians; and the cost
of a q-row verification step (q = 1..8) against a 1-row decode step at a given context depth:

    python -m bench.speculative [--model M] [--k 4] [--lookup 1,3] [--rounds 3] [--gen-tokens 128]
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
    cfg = {"method": "ngram", "num_speculative_tokens": a.k, "prompt_lookup_min": lo, "prompt_lookup_max": hi}
    kw = dict(model=a.model, max_model_len=2048, kv_cache_memory=a.kv_gib)
    engines = {"plain": LLM(**kw), "ngram": LLM(speculative_config=cfg, **kw)}
    for llm in engines.values():
        llm.llm_engine.import_torch_now()
    params = SamplingParams(temperature=0.0, max_tokens=a.gen_tokens)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    figures = {"config": cfg}
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
        plain, ngram = median(runs["plain"]), median(runs["ngram"])
        same = texts["plain"] == texts["ngram"]
        figures[f"concurrency_{n}"] = {"plain_tok_s": plain, "ngram_tok_s": ngram, "ratio": ngram / plain,
                                       "same_text": same, "runs": runs}
        print(f"{n} at a time: plain {plain:.1f} tok/s, ngram {ngram:.1f} tok/s ({ngram / plain:.2f}x), "
              f"same text: {same}")
    st = engines["ngram"].llm_engine.spec_stats
    figures["acceptance"] = {"drafts": st.num_drafts, "draft_tokens": st.num_draft_tokens,
                             "accepted": st.num_accepted_tokens, "rate": st.acceptance_rate,
                             "per_position": st.accepted_per_pos}
    print(f"accepted {st.num_accepted_tokens} of {st.num_draft_tokens} draft tokens ({st.acceptance_rate:.0%}); "
          f"per position {st.accepted_per_pos}")
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
