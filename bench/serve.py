"""Serving throughput through the HTTP server: N concurrent streaming clients x 128 tokens each.

    python -m bench.serve [--model M] [--concurrency 16] [--requests 32] [--max-tokens 128] [--threads N]
                          [--peer-server PATH/TO/llama-server]

Starts `ramlm serve` on a free 127.0.0.1 port, drives it with a bounded load generator (threads,
httpx streaming /v1/completions), prints total generated tokens/s and p50/p99 time to first token,
and writes JSON to bench/results/. Traffic goes to loopback only and the loop stops by itself.

--peer-server runs the same load, afterwards, against llama.cpp's llama-server on the same file with the same
threads and one slot per client (-np), and prints the ratio. llama-server is not part of llama-cpp-python; it
builds from the llama.cpp source that the package's sdist carries (vendor/llama.cpp):
    cmake -B build -DGGML_NATIVE=OFF <the CPU flags of `python -m bench.compare --help`> -DLLAMA_CURL=OFF
    cmake --build build --target llama-server
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

from bench.common import write_result

PROMPTS = ["Write a short story about a robot who learns to paint.", "Explain how a rainbow forms.",
           "List ten uses for a paperclip.", "Describe the city of Paris in spring.",
           "What makes a good friend?", "Summarize the plot of a detective novel you invent."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model, port, threads, extra) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "engine.entrypoints.cli", "serve", "--port", str(port), "--max-model-len", "1024",
           "--kv-cache-memory", "2"] + (["--model", model] if model else []) + \
        (["--num-threads", str(threads)] if threads else []) + extra
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log.name
    return proc


def start_peer(binary, model, port, threads, concurrency, max_tokens) -> subprocess.Popen:
    threads = str(threads or 2)
    cmd = [binary, "-m", model, "--port", str(port), "--host", "127.0.0.1", "-t", threads, "-tb", threads,
           "-np", str(concurrency), "-c", str(concurrency * (max_tokens + 128))]
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log.name
    return proc


def measure(proc, base, args) -> dict:
    try:
        wait_ready(base, proc)
        load(base, min(2, args.concurrency), 2, 8)  # warm-up
        return load(base, args.concurrency, args.requests, args.max_tokens)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(proc.log_path)


def wait_ready(base: str, proc, timeout=600) -> None:
    import httpx
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {open(proc.log_path).read()[-3000:]}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("server did not become healthy")


def one_request(base, model, prompt, max_tokens, results, lock) -> None:
    import httpx
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    first, n, finish = None, 0, None
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                first = first or time.perf_counter()
                n += 1
            if chunk.get("choices") and chunk["choices"][0].get("finish_reason"):
                finish = chunk["choices"][0]["finish_reason"]
    with lock:
        results.append({"ttft": (first or time.perf_counter()) - t0, "total": time.perf_counter() - t0,
                        "finish": finish})


def load(base, concurrency, requests, max_tokens) -> dict:
    import httpx
    model = httpx.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
    results, lock = [], threading.Lock()
    queue = list(range(requests))
    qlock = threading.Lock()

    def client():
        while True:
            with qlock:
                if not queue:
                    return
                i = queue.pop()
            one_request(base, model, PROMPTS[i % len(PROMPTS)], max_tokens, results, lock)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttfts = sorted(r["ttft"] for r in results)
    # tok/s counts max_tokens per request: every stream must have ended on its length limit (ignore_eos)
    short = sum(r["finish"] != "length" for r in results)
    if short:
        raise RuntimeError(f"{short} of {len(results)} streams ended before max_tokens: tok/s would be overstated")

    def pct(p):
        return ttfts[min(len(ttfts) - 1, int(round(p * (len(ttfts) - 1))))]
    return {"requests": len(results), "concurrency": concurrency, "max_tokens": max_tokens,
            "total_generated_tok_s": requests * max_tokens / wall, "wall_s": wall,
            "ttft_p50_s": pct(0.5), "ttft_p99_s": pct(0.99)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--server-arg", action="append", default=[], help="extra flag for ramlm serve")
    ap.add_argument("--peer-server", default=None, help="llama.cpp's llama-server binary: the same load against it")
    args = ap.parse_args(argv)
    port = free_port()
    res = measure(start_server(args.model, port, args.threads, args.server_arg), f"http://127.0.0.1:{port}", args)
    print(f"serve: {res['requests']} requests x {args.max_tokens} tokens at concurrency {args.concurrency}: "
          f"{res['total_generated_tok_s']:.1f} generated tok/s, TTFT p50 {res['ttft_p50_s']:.2f} s, "
          f"p99 {res['ttft_p99_s']:.2f} s")
    extra = {"model": args.model}
    if args.peer_server:
        from engine.default_model import default_model_path
        model = args.model or default_model_path()
        port = free_port()
        peer = measure(start_peer(args.peer_server, model, port, args.threads, args.concurrency, args.max_tokens),
                       f"http://127.0.0.1:{port}", args)
        ratio = res["total_generated_tok_s"] / peer["total_generated_tok_s"]
        print(f"llama-server ({args.concurrency} slots): {peer['total_generated_tok_s']:.1f} generated tok/s, TTFT p50 "
              f"{peer['ttft_p50_s']:.2f} s, p99 {peer['ttft_p99_s']:.2f} s | ratio {ratio:.2f}x")
        res = {**res, "llama_server_tok_s": peer["total_generated_tok_s"], "ratio": ratio}
        extra["llama_server"] = peer
    path = write_result("serve", res, extra)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
