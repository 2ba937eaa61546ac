"""Multi-LoRA's cost: total decode tok/s of N concurrent greedy requests spread over A adapters of rank r (PEFT folders
of random weights on every attention and MLP projection, written in PEFT's layout for the model's shapes) against the
same N requests with no adapter, on one engine, alternating rounds, medians:

    python -m bench.lora [--model M] [--adapters 4] [--rank 16] [--concurrency 16] [--gen-tokens 128] [--rounds 3]
                         [--lora-dtype auto|float32|bfloat16] [--prefill 1024]

--prefill N also times an N-token prompt's prefill (one request, a new prompt every run: no prefix-cache hits) with
one of the adapters against none.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from bench.common import median, write_result

PROJECTIONS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}


def write_adapter(folder: str, linears: dict, num_layers: int, rank: int, seed: int) -> str:
    """A PEFT folder: lora_A (r, K) and lora_B (N, r) per projection and layer, sized from the model's Linears."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(num_layers):
        for hf, gguf in PROJECTIONS.items():
            lin = linears[f"blk.{layer}.{gguf}.weight"]
            stem = f"base_model.model.model.layers.{layer}.{hf}"
            tensors[stem + ".lora_A.weight"] = rng.normal(0, 0.02, (rank, lin.weight.K)).astype(np.float32)
            tensors[stem + ".lora_B.weight"] = rng.normal(0, 0.02, (lin.weight.N, rank)).astype(np.float32)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
                   "target_modules": [k.split(".")[-1] for k in PROJECTIONS]}, f)
    return folder


def _prefill(llm, lora, a) -> dict:
    """tok/s of an a.prefill-token prompt (a fresh one each run) with `lora` and without, alternating, medians."""
    from engine import SamplingParams
    rng = np.random.default_rng(0)
    runs = {"none": [], "lora": []}
    for r in range(a.rounds + 1):
        for k in runs:
            ids = rng.integers(100, llm.llm_engine.config.vocab_size - 1, a.prefill).tolist()
            t0 = time.perf_counter()
            llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1), use_tqdm=False,
                         lora_request=lora if k == "lora" else None)
            if r:
                runs[k].append(a.prefill / (time.perf_counter() - t0))
    none, with_lora = median(runs["none"]), median(runs["lora"])
    print(f"pp{a.prefill}: {with_lora:.0f} tok/s with a rank-{a.rank} adapter against {none:.0f} without "
          f"({with_lora / none:.2f}x)")
    return {"tokens": a.prefill, "none_tok_s": none, "lora_tok_s": with_lora, "ratio": with_lora / none, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lora-dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    ap.add_argument("--prefill", type=int, default=0, help="also time an N-token prefill with and without an adapter")
    a = ap.parse_args()
    from engine import LLM, LoRARequest, SamplingParams
    from engine.lora.manager import adaptable
    llm = LLM(model=a.model, enable_lora=True, max_loras=a.adapters, max_lora_rank=a.rank,
              max_model_len=max(1024, a.prefill + 16),
              lora_dtype=a.lora_dtype)
    llm.llm_engine.import_torch_now()
    eng = llm.llm_engine
    tmp = tempfile.mkdtemp(prefix="ramlm-lora-bench-")
    linears = adaptable(eng.model)
    loras = [LoRARequest(f"a{i}", i + 1, write_adapter(os.path.join(tmp, f"a{i}"), linears, eng.config.num_layers,
                                                       a.rank, i)) for i in range(a.adapters)]
    prompts = [f"Write a short story about a lighthouse keeper, number {i}." for i in range(a.concurrency)]
    params = SamplingParams(temperature=0.0, max_tokens=a.gen_tokens, ignore_eos=True)
    loads = {"none": [None] * a.concurrency, "lora": [loras[i % a.adapters] for i in range(a.concurrency)]}
    runs = {k: [] for k in loads}
    for r in range(a.rounds + 1):
        for k, which in loads.items():
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False, lora_request=which)
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            if r:  # round 0 warms (and reads the adapters)
                runs[k].append(tokens / (time.perf_counter() - t0))
    none, lora = median(runs["none"]), median(runs["lora"])
    print(f"{a.concurrency} requests, {a.adapters} rank-{a.rank} adapters: {lora:.1f} tok/s against {none:.1f} with "
          f"no adapter ({lora / none:.2f}x)")
    prefill = _prefill(llm, loras[0], a) if a.prefill else None
    write_result("lora", {"model": eng.model_path, "adapters": a.adapters, "rank": a.rank, "prefill": prefill,
                          "lora_dtype": eng.lora.dtype,
                          "concurrency": a.concurrency, "gen_tokens": a.gen_tokens, "none_tok_s": none,
                          "lora_tok_s": lora, "ratio": lora / none, "runs": runs})


if __name__ == "__main__":
    main()
