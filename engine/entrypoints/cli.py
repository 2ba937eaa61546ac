"""The `ramlm` command: dispatch only; each subcommand lives with the code it drives."""
from __future__ import annotations

import argparse
import sys


def _cmd_info(ns: argparse.Namespace) -> int:
    from engine.model.info import format_info, model_info
    from engine.args import EngineArgs
    path = ns.model or EngineArgs().resolved_model()
    print(format_info(model_info(path)))
    return 0


def _cmd_generate(ns: argparse.Namespace) -> int:
    from engine.entrypoints.generate_cli import run_generate
    return run_generate(ns)


def _cmd_serve(ns: argparse.Namespace) -> int:
    from engine.entrypoints.serve_cli import run_serve
    return run_serve(ns)


def _cmd_chat(ns: argparse.Namespace) -> int:
    from engine.entrypoints.chat_cli import run_chat
    return run_chat(ns)


def _cmd_bench(ns: argparse.Namespace) -> int:
    import importlib
    mod = importlib.import_module(f"bench.{ns.which}")
    mod.main(ns.rest)
    return 0


def _cmd_plan(ns: argparse.Namespace) -> int:
    from engine.entrypoints.plan_cli import run_plan
    return run_plan(ns)


def _cmd_quantize(ns: argparse.Namespace) -> int:
    import time
    from engine.model.gguf_save import save_quantized_gguf
    t0 = time.perf_counter()
    counts = save_quantized_gguf(ns.model, ns.out, ns.quantization)
    kinds = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
    print(f"wrote {ns.out} ({kinds}) in {time.perf_counter() - t0:.1f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from engine.args import EngineArgs
    from engine.entrypoints.generate_cli import add_generate_args
    p = argparse.ArgumentParser(prog="ramlm", description="CPU-first LLM inference and serving")
    sub = p.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="architecture, hyperparameters, tensor types and memory of a model")
    info.add_argument("model", nargs="?", default=None)
    info.set_defaults(func=_cmd_info)

    gen = sub.add_parser("generate", help="generate text for one prompt, streamed to stdout")
    gen.add_argument("prompt")
    EngineArgs.add_cli_args(gen)
    add_generate_args(gen)
    gen.set_defaults(func=_cmd_generate)

    from engine.entrypoints.serve_cli import add_serve_args
    serve = sub.add_parser("serve", help="OpenAI- and Anthropic-compatible HTTP server")
    add_serve_args(serve)
    serve.set_defaults(func=_cmd_serve)

    from engine.entrypoints.chat_cli import add_chat_args
    chat = sub.add_parser("chat", help="interactive chat in the terminal (engine in-process)")
    add_chat_args(chat)
    chat.set_defaults(func=_cmd_chat)

    from engine.entrypoints.plan_cli import add_plan_args
    plan = sub.add_parser("plan", help="where each layer and KV block would go (RAM or GPU), and why")
    add_plan_args(plan)
    plan.set_defaults(func=_cmd_plan)

    quant = sub.add_parser("quantize", help="a GGUF file's float tensors quantized by --quantization into a new GGUF "
                                            "file (llama-quantize's job)")
    quant.add_argument("model", help="the source GGUF file (F32/F16/BF16 tensors are quantized)")
    quant.add_argument("out", help="the GGUF file to write")
    quant.add_argument("--quantization", "-q", required=True, help="q8_0, q4_k, int8 or int4 (as at load)")
    quant.set_defaults(func=_cmd_quantize)

    bench = sub.add_parser("bench", help="benchmarks: speed (prefill/decode), perplexity, ...")
    bench.add_argument("which", help="bench module: speed, perplexity, ...")
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    from engine.errors import ModelLoadError
    try:
        return ns.func(ns) or 0
    except (ModelLoadError, ValueError, NotImplementedError) as e:
        print(f"ramlm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
