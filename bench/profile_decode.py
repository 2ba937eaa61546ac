"""Where a decode step's time goes, per kernel: wraps each kernel entry point with a timer.

    python -m bench.profile_decode [--model M] [--steps 64] [--batch 1] [--threads N] [--kernels]

Prints milliseconds per step by kernel (matmuls split by weight format and shape) and the share of
the step; the rest ("python") is everything between kernels. A decode step runs each block as one compiled
call ("fused block", engine/model/fused_block.py); --kernels runs the blocks' kernels one by one instead
(RAMLM_FUSED_BLOCKS=0), so that each shows on its own line, with the Python between them.
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import time

TIMES: collections.Counter = collections.Counter()


def _timed(label, fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            TIMES[label(*a, **kw) if callable(label) else label] += time.perf_counter() - t0
    return wrapper


def instrument() -> None:
    from cpu_kernels import activations, attention, norms, rope
    from cpu_kernels.quant.linear import QuantLinear
    from engine.sample import sampler
    from engine.model import fused_block
    from engine.model.parts import attention as attention_part, mlp
    fused_block.block_step = _timed("fused block", fused_block.block_step)
    for mod, names in ((norms, ["rms_norm", "residual_rms_norm"]), (rope, ["rope_cos_sin", "rotate"]),
                       (attention, ["write_kv", "paged_attention"]), (attention_part, ["attn_inputs"]),
                       (activations, ["softcap"])):
        for n in names:
            setattr(mod, n, _timed(n, getattr(mod, n)))
    # the gated activations, looked up by name by the MLP and MoE parts
    mlp.ACTIVATIONS = {k: (_timed(k, f), code) for k, (f, code) in mlp.ACTIVATIONS.items()}
    QuantLinear.matmul = _timed(lambda self, x, *a, **k: f"matmul {self.ggml_type.name} {self.N}x{self.K}",
                                QuantLinear.matmul)
    QuantLinear.embed = _timed("embed", QuantLinear.embed)
    sampler.Sampler.sample = _timed("sample", sampler.Sampler.sample)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--kernels", action="store_true", help="the blocks' kernels one by one (no fused blocks)")
    args = ap.parse_args(argv)
    if args.kernels:
        os.environ["RAMLM_FUSED_BLOCKS"] = "0"
    from engine import LLM, SamplingParams
    llm = LLM(model=args.model, num_threads=args.threads, max_model_len=1024, kv_cache_memory=1.0)
    params = SamplingParams(max_tokens=args.steps + 1, temperature=0, ignore_eos=True)
    prompts = [{"prompt_token_ids": [llm.get_tokenizer().bos_token_id, 1000 + i, 2000, 3000]}
               for i in range(args.batch)]
    llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)  # warm-up
    llm.llm_engine.import_torch_now()  # not in the timed steps
    instrument()
    eng = llm.llm_engine
    for p in prompts:
        eng.add_request(None, p, params)
    eng.step()  # the prefill step is not counted
    TIMES.clear()
    t0 = time.perf_counter()
    steps = 0
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
    total = (time.perf_counter() - t0) / steps
    kernels = sum(TIMES.values()) / steps
    print(f"decode step, batch {args.batch}: {total * 1e3:.2f} ms ({args.batch / total:.1f} tok/s); by kernel:")
    for name, t in TIMES.most_common():
        print(f"  {t / steps * 1e3:8.3f} ms  {100 * t / steps / total:5.1f} %  {name}")
    print(f"  {(total - kernels) * 1e3:8.3f} ms  {100 * (total - kernels) / total:5.1f} %  python and the rest")


if __name__ == "__main__":
    main()
