"""`ramlm generate`: one prompt, text streamed to stdout (or one JSON object with --json)."""
from __future__ import annotations

import argparse
import json
import sys
import time


def add_generate_args(p: argparse.ArgumentParser) -> None:
    """The prompt's flags: sampling (generated from SamplingParams) and the output's form."""
    from engine.entrypoints.sampling_args import add_sampling_args
    add_sampling_args(p, max_tokens=128, temperature=0.0)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")


def run_generate(ns: argparse.Namespace) -> int:
    from engine import LLM
    from engine.args import EngineArgs
    from engine.entrypoints.sampling_args import sampling_params_from
    args = EngineArgs.from_cli_args(ns)
    params = sampling_params_from(ns)  # a bad value fails before the model loads
    t0 = time.perf_counter()
    llm = LLM(**vars(args))
    llm.llm_engine.import_torch_when_idle = False  # one prompt, then exit: a background import would delay it
    prompt = ns.prompt
    if ns.chat:
        prompt = llm.get_tokenizer().apply_chat_template([{"role": "user", "content": prompt}],
                                                         add_generation_prompt=True, tokenize=False)
    t_load = time.perf_counter() - t0
    final, first, shown = None, None, 0
    t1 = time.perf_counter()
    for out in llm.generate_stream(prompt, params):
        if first is None:
            first = time.perf_counter() - t1
        if not ns.json:
            text = out.outputs[0].text  # cumulative: print what is new
            sys.stdout.write(text[shown:])
            sys.stdout.flush()
            shown = len(text)
        final = out
    elapsed = time.perf_counter() - t1
    comp = final.outputs[0]
    n = len(comp.token_ids)
    if ns.json:
        print(json.dumps({"prompt": ns.prompt, "text": comp.text, "token_ids": comp.token_ids,
                          "finish_reason": comp.finish_reason, "prompt_tokens": len(final.prompt_token_ids),
                          "completion_tokens": n, "load_s": round(t_load, 3), "ttft_s": round(first or 0, 3),
                          "total_s": round(elapsed, 3)}))
    else:
        decode_s = max(elapsed - (first or 0), 1e-9)
        print(f"\n[{len(final.prompt_token_ids)} prompt + {n} generated tokens; load {t_load:.2f} s, "
              f"first token {first or 0:.2f} s, {max(n - 1, 0) / decode_s:.1f} tok/s]", file=sys.stderr)
    return 0
