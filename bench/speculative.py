"""Speculative decoding's gain: greedy tok/s (end to end, and decode alone: after each request's first token) with
drafts (n-gram; suffix, with and without its tree of recent outputs, which learns the set's answers over the rounds)
against the same engine without them, on input-grounded chats (bench/spec_prompts.py), one request and 16 at a time,
alternating rounds, medians; and the cost of a q-row verification step (q = 1..8) against a 1-row decode step at a
given context depth:

    python -m bench.speculative [--model M] [--methods ngram,suffix,suffix-nocache] [--k 4] [--lookup 1,3]
                                [--rounds 3] [--gen-tokens 128] [--llamacpp]

--llamacpp adds llama.cpp on the same GGUF and the same prompt tokens, one request at a time, without and with its
prompt-lookup speculative decoding (llama-cpp-python's LlamaPromptLookupDecoding, num_pred_tokens k,
max_ngram_size the lookup's upper bound; the llama-server binary with its n-gram draft types is not installed here),
each round in a fresh worker process while ramlm waits (the build: `python -m bench.compare --help`).
    python -m bench.speculative --step-cost [--model M] [--depth 512]
"""
from __future__ import annotations

import argparse
import time

from bench.common import median, write_result


def _decode_rate(calls) -> float:
    """Decode tok/s of generate calls: every token after a request's first, over the time from each call's first
    first token to its last token (prefill and the first token's step left out)."""
    tokens = sum(len(o.outputs[0].token_ids) - 1 for call in calls for o in call)
    span = sum(max(o.metrics.last_token_time for o in call) - min(o.metrics.first_token_time for o in call)
               for call in calls)
    return tokens / span


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
        runs, decode_runs, texts = {k: [] for k in engines}, {k: [] for k in engines}, {}
        for r in range(a.rounds + 1):
            for k, llm in engines.items():
                t0 = time.perf_counter()
                if n == 1:  # every chat of the set, one after another
                    calls = [llm.chat([c], params, use_tqdm=False) for c in chats]
                else:
                    calls = [llm.chat([chats[i % len(chats)] for i in range(n)], params, use_tqdm=False)]
                elapsed = time.perf_counter() - t0
                outs = [o for call in calls for o in call]
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
                texts[k] = [o.outputs[0].text for o in outs]
                if r:  # round 0 warms
                    runs[k].append(tokens / elapsed)
                    decode_runs[k].append(_decode_rate(calls))
        plain, plain_decode = median(runs["plain"]), median(decode_runs["plain"])
        figures[f"concurrency_{n}"] = {"plain_tok_s": plain, "plain_decode_tok_s": plain_decode, "runs": runs,
                                       "decode_runs": decode_runs}
        for m in methods:
            tok_s, dec, same = median(runs[m]), median(decode_runs[m]), texts["plain"] == texts[m]
            figures[f"concurrency_{n}"][m] = {"tok_s": tok_s, "ratio": tok_s / plain, "decode_tok_s": dec,
                                              "decode_ratio": dec / plain_decode, "same_text": same}
            print(f"{n} at a time: plain {plain:.1f} tok/s, {m} {tok_s:.1f} tok/s ({tok_s / plain:.2f}x), "
                  f"same text: {same}; decode alone (after each first token) plain {plain_decode:.1f}, {m} "
                  f"{dec:.1f} tok/s ({dec / plain_decode:.2f}x)")
    if a.llamacpp:  # the same prompt tokens (the chat template rendered by ramlm), one at a time
        from engine.default_model import default_model_path
        a.model = a.model or default_model_path()
        tok = engines["plain"].get_tokenizer()
        prompt_ids = [tok.encode(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False),
                                 add_special_tokens=False) for c in chats]
        rounds = [_llamacpp_round(a, prompt_ids) for _ in range(a.rounds)]
        plain, lookup = median([r["plain"] for r in rounds]), median([r["lookup"] for r in rounds])
        same = rounds[0]["texts"]["plain"] == rounds[0]["texts"]["lookup"]
        figures["llamacpp_1"] = {"plain_tok_s": plain, "lookup_tok_s": lookup, "ratio": lookup / plain,
                                 "same_tokens": same, "runs": rounds}
        ours = figures["concurrency_1"]
        print(f"llama.cpp 1 at a time: plain {plain:.1f} tok/s, prompt lookup {lookup:.1f} tok/s "
              f"({lookup / plain:.2f}x), same tokens: {same}")
        for m in methods:
            print(f"  ramlm {m} / llama.cpp prompt lookup: {ours[m]['tok_s'] / lookup:.2f}x; "
                  f"ramlm plain / llama.cpp plain: {ours['plain_tok_s'] / plain:.2f}x")
    for m in methods:
        st = engines[m].llm_engine.spec_stats
        figures[f"acceptance_{m}"] = {"drafts": st.num_drafts, "draft_tokens": st.num_draft_tokens,
                                      "accepted": st.num_accepted_tokens, "rate": st.acceptance_rate,
                                      "per_position": st.accepted_per_pos}
        print(f"{m}: accepted {st.num_accepted_tokens} of {st.num_draft_tokens} draft tokens "
              f"({st.acceptance_rate:.0%}); per position {st.accepted_per_pos}")
    return figures


def _llamacpp_worker(a) -> None:
    """Prints {"plain": tok/s, "lookup": tok/s, "texts": {...}} of llama.cpp over the prompts in a.worker_prompts."""
    import json

    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    prompts = json.loads(open(a.worker_prompts).read())
    hi = int(a.lookup.split(",")[1])
    out = {"texts": {}}
    for mode in ("plain", "lookup"):
        draft = LlamaPromptLookupDecoding(num_pred_tokens=a.k, max_ngram_size=hi) if mode == "lookup" else None
        llm = Llama(model_path=a.model, n_threads=2, n_threads_batch=2, n_ctx=2048, n_batch=512, verbose=False,
                    draft_model=draft)
        tokens, seconds, texts = 0, 0.0, []
        for ids in prompts:
            got, t0 = [], time.perf_counter()
            for t in llm.generate(ids, top_k=1, temp=0.0, reset=True):
                if t == llm.token_eos() or len(got) == a.gen_tokens:
                    break
                got.append(t)
            seconds += time.perf_counter() - t0
            tokens += len(got)
            texts.append(got)
        out[mode], out["texts"][mode] = tokens / seconds, texts
    print(json.dumps(out))


def _llamacpp_round(a, prompt_ids) -> dict:
    import json
    import subprocess
    import sys
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompt_ids, f)
    cmd = [sys.executable, "-m", "bench.speculative", "--llamacpp-worker", f.name, "--model", a.model, "--k",
           str(a.k), "--lookup", a.lookup, "--gen-tokens", str(a.gen_tokens)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    ap.add_argument("--llamacpp", action="store_true", help="also llama.cpp with and without prompt lookup")
    ap.add_argument("--llamacpp-worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.llamacpp_worker:
        a.worker_prompts = a.llamacpp_worker
        return _llamacpp_worker(a)
    figures = _step_cost(a) if a.step_cost else _gain(a)
    print(f"wrote {write_result('speculative-step' if a.step_cost else 'speculative', figures, vars(a))}")


if __name__ == "__main__":
    main()
