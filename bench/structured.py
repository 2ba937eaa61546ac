"""Structured outputs' cost: decode tok/s with a JSON schema against the same requests unconstrained, 1 and 16 at a
time, alternating rounds, medians; and a typical schema's compile time, cold and cached:

    python -m bench.structured [--model M] [--backend auto|xgrammar|guidance] [--rounds 3] [--gen-tokens 96]

The schema (an object with an array of strings) lets the output run to max_tokens, so both sides decode as many
tokens; tok/s counts the tokens each request generated over the wall time of its batch.
"""
from __future__ import annotations

import argparse
import time

from bench.common import median, write_result

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"},
                                           "lines": {"type": "array", "items": {"type": "string"}}},
          "required": ["title", "lines"]}
PROMPT = "Write a long poem about the sea as JSON with a title and its lines."


def _typical(i: int) -> dict:
    """A typical API schema, its property names varied so that each compile is cold."""
    return {"type": "object", "properties": {
        f"name_{i}": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city"]},
        "role": {"enum": ["admin", "user", "guest"]}}, "required": [f"name_{i}", "age", "role"]}


def main(argv=None) -> None:
    from engine import LLM, SamplingParams
    from engine.structured.params import StructuredOutputsParams
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--backend", default="auto", choices=("auto", "xgrammar", "guidance"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=96)
    ap.add_argument("--concurrency", default="1,16")
    a = ap.parse_args(argv)
    llm = LLM(model=a.model, max_model_len=1024, structured_outputs_backend=a.backend)
    llm.llm_engine.import_torch_now()
    so = StructuredOutputsParams(json=SCHEMA)
    kinds = {"free": SamplingParams(max_tokens=a.gen_tokens, temperature=0.0, ignore_eos=True),
             "schema": SamplingParams(max_tokens=a.gen_tokens, temperature=0.0, ignore_eos=True,
                                      structured_outputs=so)}
    figures = {}
    for n in (int(c) for c in a.concurrency.split(",")):
        runs = {k: [] for k in kinds}
        for r in range(a.rounds + 1):
            for k, sp in kinds.items():
                t0 = time.perf_counter()
                outs = llm.generate([PROMPT] * n, sp, use_tqdm=False)
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
                if r:  # round 0 warms (and compiles the grammar)
                    runs[k].append(tokens / (time.perf_counter() - t0))
        free, schema = median(runs["free"]), median(runs["schema"])
        figures[f"concurrency_{n}"] = {"free_tok_s": free, "schema_tok_s": schema, "ratio": schema / free,
                                       "runs": runs}
        print(f"{n} at a time: free {free:.1f} tok/s, schema {schema:.1f} tok/s ({schema / free:.2f}x)")
    manager = llm.llm_engine.structured
    cold, cached = [], []
    for i in range(5):
        p = StructuredOutputsParams(json=_typical(i))
        t0 = time.perf_counter()
        manager.compile(p).result()
        cold.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        manager.compile(StructuredOutputsParams(json=_typical(i))).result()
        cached.append((time.perf_counter() - t0) * 1e3)
    figures["compile_ms"] = {"cold": median(cold), "cached": median(cached), "cold_runs": cold}
    print(f"typical schema compile: {median(cold):.1f} ms cold, {median(cached):.3f} ms cached")
    print(f"wrote {write_result('structured', figures, vars(a))}")


if __name__ == "__main__":
    main()
