r"""ramlm against llama.cpp on the same GGUF and thread count, alternating, medians and ratios.

    python -m bench.compare [--model M] [--threads 2] [--rounds 3] [--prompt-tokens 512] [--gen-tokens 128]

llama.cpp comes from llama-cpp-python built from source with GGML_NATIVE and AMX off (the native build
dies with SIGILL on these virtual machines) and the host's vector extensions on. AVX-512 hosts (Zen 4,
Sapphire Rapids):

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON \
      -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" pip install llama-cpp-python

AVX2-only hosts (Zen 3: `grep -c avx512f /proc/cpuinfo` prints 0), where the line above dies with SIGILL:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
      pip install --no-cache-dir --force-reinstall llama-cpp-python

Each measurement runs in a fresh worker process (so the two runtimes' thread pools never share a
process), ramlm and llama.cpp in turn, round after round; the figures are the medians.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.common import median, write_result


def _prompt_ids(vocab_size: int, n: int, bos: int) -> list[int]:
    # The same pseudo-random ordinary token ids for both engines (no text round trip needed).
    import numpy as np
    rng = np.random.default_rng(0)
    return [bos] + [int(t) for t in rng.integers(300, min(vocab_size, 30000), n - 1)]


def worker_ramlm(model, threads, prompt_tokens, gen_tokens, prefill_dtype="auto") -> dict:
    from engine import LLM, SamplingParams
    t0 = time.perf_counter()
    llm = LLM(model=model, num_threads=threads, enable_prefix_caching=False, max_model_len=2048,
              kv_cache_memory=1.0, prefill_dtype=prefill_dtype)
    load = time.perf_counter() - t0
    tok = llm.get_tokenizer()
    prompt = _prompt_ids(llm.llm_engine.config.vocab_size, prompt_tokens, tok.bos_token_id)
    greedy1 = SamplingParams(max_tokens=1, temperature=0)
    llm.generate({"prompt_token_ids": prompt[:64]}, greedy1, use_tqdm=False)  # warm-up, as for llama.cpp
    llm.llm_engine.import_torch_now()  # its background import would otherwise share the timed prompt's cores
    t0 = time.perf_counter()
    llm.generate({"prompt_token_ids": prompt}, greedy1, use_tqdm=False)
    pp = prompt_tokens / (time.perf_counter() - t0)
    first = None
    t0 = time.perf_counter()
    for _ in llm.generate_stream({"prompt_token_ids": prompt[:8]},
                                 SamplingParams(max_tokens=gen_tokens, temperature=0, ignore_eos=True)):
        first = first or time.perf_counter()
    tg = (gen_tokens - 1) / (time.perf_counter() - first)
    return {"pp": pp, "tg": tg, "load_s": load, "peak_rss_gb": _peak_rss_gb(), "anon_huge_gb": _anon_huge_gb()}


def _anon_huge_gb() -> float | None:
    """Memory of this worker in transparent huge pages (Linux): the weights' share varies with the host's
    fragmentation, and a GEMV from DRAM ran up to 25 % slower in 4 KiB pages (engine/worker/huge_pages.py)."""
    try:
        for line in open("/proc/self/smaps_rollup"):
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return None


def _peak_rss_gb() -> float:
    """This worker process's peak resident set (Linux reports ru_maxrss in KiB)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def worker_llamacpp(model, threads, prompt_tokens, gen_tokens) -> dict:
    from llama_cpp import Llama
    t0 = time.perf_counter()
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=2048, n_batch=512,
                n_ubatch=512, verbose=False)
    load = time.perf_counter() - t0
    prompt = _prompt_ids(llm.n_vocab(), prompt_tokens, llm.token_bos())
    llm.eval(prompt[:64])  # warm-up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    pp = prompt_tokens / (time.perf_counter() - t0)
    llm.reset()
    first = None
    for i, _tok in enumerate(llm.generate(prompt[:8], top_k=1, temp=0.0, reset=True)):
        if i == 0:
            first = time.perf_counter()
        if i + 1 == gen_tokens:
            break
    tg = (gen_tokens - 1) / (time.perf_counter() - first)
    return {"pp": pp, "tg": tg, "load_s": load, "peak_rss_gb": _peak_rss_gb(), "anon_huge_gb": _anon_huge_gb()}


def llamacpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
        return True
    except Exception:
        return False


def run_worker(engine: str, args) -> dict:
    cmd = [sys.executable, "-m", "bench.compare", "--worker", engine, "--model", args.model, "--threads",
           str(args.threads), "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
           "--prefill-dtype", args.prefill_dtype]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode == -4 and engine == "llamacpp":  # SIGILL
        raise RuntimeError("llama.cpp died with SIGILL: llama-cpp-python was built for instructions this CPU "
                           "lacks (AVX-512 on an AVX2-only host?); rebuild it with the matching line in "
                           "`python -m bench.compare --help`")
    if out.returncode != 0:
        raise RuntimeError(f"{engine} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--worker", choices=["ramlm", "llamacpp"], default=None)
    ap.add_argument("--prefill-dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="ramlm's precision for long prefill chunks")
    args = ap.parse_args(argv)
    if args.model is None:
        from engine.default_model import default_model_path
        args.model = default_model_path()
    if args.worker:
        if args.worker == "ramlm":
            res = worker_ramlm(args.model, args.threads, args.prompt_tokens, args.gen_tokens, args.prefill_dtype)
        else:
            res = worker_llamacpp(args.model, args.threads, args.prompt_tokens, args.gen_tokens)
        print(json.dumps(res))
        return
    have_peer = llamacpp_available()
    if not have_peer:
        print("llama.cpp (llama-cpp-python) is not installed: measuring ramlm only. "
              "Install line: see `python -m bench.compare --help`.")
    runs = {"ramlm": [], "llamacpp": []}
    for _ in range(args.rounds):
        runs["ramlm"].append(run_worker("ramlm", args))
        if have_peer:
            runs["llamacpp"].append(run_worker("llamacpp", args))
    fig = {}
    for eng, rs in runs.items():
        if rs:
            fig[eng] = {k: median([r[k] for r in rs]) for k in ("pp", "tg", "load_s", "peak_rss_gb")}
    line = (f"{args.model.rsplit('/', 1)[-1]}, {args.threads} threads, median of {args.rounds}: "
            f"ramlm pp{args.prompt_tokens} {fig['ramlm']['pp']:.1f} tok/s, "
            f"tg{args.gen_tokens} {fig['ramlm']['tg']:.1f} tok/s")
    line += f", peak RSS {fig['ramlm']['peak_rss_gb']:.2f} GB (file {os.path.getsize(args.model) / 1e9:.2f} GB)"
    if "llamacpp" in fig:
        fig["ratio"] = {k: fig["ramlm"][k] / fig["llamacpp"][k] for k in ("pp", "tg")}
        line += (f" | llama.cpp pp {fig['llamacpp']['pp']:.1f}, tg {fig['llamacpp']['tg']:.1f}"
                 f" | ratio pp {fig['ratio']['pp']:.2f}x, tg {fig['ratio']['tg']:.2f}x")
    print(line)
    path = write_result("compare", fig, {"model": args.model, "threads": args.threads, "rounds": runs,
                                         "prefill_dtype": args.prefill_dtype})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
