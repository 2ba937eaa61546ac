"""How far the GPU code path (gpu_kernels, torch) moves per-token logprobs from the CPU kernels, teacher-forced.

    python -m bench.offload_fidelity [MODEL] [--tokens 300] [--device cpu] [--cpu-default] [--no-json]

The first --tokens tokens of ../shared/reference/texts/gpl-3.txt go through the engine twice as one prompt:
every layer and the output matrix on the GPU path (`n_gpu_layers="all"`, weights dequantized once; `--device
cpu`, the default, runs it on torch's CPU device), and every layer on the CPU kernels with `batch_invariant`
(each row through decode's GEMV kernels, which round activations to int8 per 32-block as llama.cpp does; the
GPU path multiplies float32 activations). Each gives the logprob of every next token of the text
(prompt_logprobs); prints one line: how many tokens, the largest and mean |difference|, its 99th percentile,
how often the two agree on the most likely next token, and each one's mean negative log-likelihood.
"""
from __future__ import annotations

import argparse
import gc
import os

import numpy as np

from bench.common import write_result

TEXT = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "reference", "texts", "gpl-3.txt")
# One request, a short context: the engines' KV pools stay small.
ENGINE = dict(max_model_len=1024, max_num_seqs=1, max_num_batched_tokens=1024, kv_cache_memory=0.05)


def text_ids(tokenizer, n: int, path: str = TEXT) -> list[int]:
    with open(path, encoding="utf-8") as f:
        ids = tokenizer.encode(f.read())
    if len(ids) < n:
        raise ValueError(f"{path} has {len(ids)} tokens, fewer than {n}")
    return ids[:n]


def next_token_logprobs(llm, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(logprob of ids[i + 1], the most likely token) at every position i, from one prefill."""
    from engine import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    out = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].prompt_logprobs[1:]
    lp = np.array([pos[t].logprob for pos, t in zip(out, ids[1:])])
    top = np.array([next(t for t, x in pos.items() if x.rank == 1) for pos in out])
    return lp, top


def compare(model: str | None, n_tokens: int, device: str = "cpu", cpu_default: bool = False) -> dict:
    """Figures of the GPU path against the CPU kernels on the same n_tokens tokens; cpu_default also scores the
    CPU kernels with the default prefill (long chunks in bf16 or int8 GEMMs) against the batch-invariant run."""
    from engine import LLM
    engines = {"gpu_path": dict(n_gpu_layers="all", gpu_device=device), "cpu": dict(batch_invariant=True)}
    if cpu_default:
        engines["cpu_default"] = {}
    runs = {}
    for name, kw in engines.items():
        llm = LLM(model, **ENGINE, **kw)
        ids = text_ids(llm.get_tokenizer(), n_tokens)
        runs[name] = next_token_logprobs(llm, ids)
        del llm
        gc.collect()
    (gpu, gpu_top), (cpu, cpu_top) = runs["gpu_path"], runs["cpu"]
    diff = np.abs(gpu - cpu)
    f = {"tokens": int(diff.size), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
         "p99_abs_diff": float(np.percentile(diff, 99)), "worst_position": int(diff.argmax()) + 1,
         "top1_agreement": float(np.mean(gpu_top == cpu_top)), "mean_nll_gpu_path": float(-gpu.mean()),
         "mean_nll_cpu": float(-cpu.mean())}
    if cpu_default:
        own = np.abs(runs["cpu_default"][0] - cpu)
        f.update(cpu_default_max_abs_diff=float(own.max()), cpu_default_mean_abs_diff=float(own.mean()))
    return f


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None, help="GGUF file or HF folder (default: the embedded model)")
    ap.add_argument("--tokens", type=int, default=300, help="tokens of the text to score")
    ap.add_argument("--device", default="cpu", help="device of the GPU path: cpu (torch's CPU device), cuda:0, ...")
    ap.add_argument("--cpu-default", action="store_true",
                    help="also score the CPU kernels' default prefill against their batch-invariant run")
    ap.add_argument("--no-json", action="store_true")
    args = ap.parse_args(argv)
    f = compare(args.model, args.tokens, args.device, args.cpu_default)
    print(f"GPU path on {args.device} vs CPU kernels, {f['tokens']} next-token logprobs: max |diff| "
          f"{f['max_abs_diff']:.4f} (position {f['worst_position']}), mean {f['mean_abs_diff']:.4f}, "
          f"p99 {f['p99_abs_diff']:.4f}; same most likely token at {100 * f['top1_agreement']:.1f} % of positions; "
          f"mean NLL {f['mean_nll_gpu_path']:.4f} vs {f['mean_nll_cpu']:.4f}"
          + (f"; CPU default prefill vs batch-invariant: max {f['cpu_default_max_abs_diff']:.4f}, mean "
             f"{f['cpu_default_mean_abs_diff']:.4f}" if args.cpu_default else ""))
    if not args.no_json:
        from engine.args import EngineArgs
        model = EngineArgs(model=args.model).resolved_model()
        print("wrote " + write_result("offload-fidelity", f, {"model": model, "device": args.device}))


if __name__ == "__main__":
    main()
