"""`ramlm serve [MODEL]`: the OpenAI/Anthropic-compatible HTTP server (FastAPI + uvicorn)."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cpu_kernels import envs
from engine.entrypoints.server import limits

def add_serve_args(p: argparse.ArgumentParser) -> None:
    from engine.args import EngineArgs
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="GGUF file or HF folder (same as --model; default: the embedded gemma-3-270m)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help="require this key (Authorization: Bearer KEY or x-api-key); default: $RAMLM_API_KEY")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) clients use; the first is reported (default: the model's file name)")
    p.add_argument("--max-request-body-bytes", type=int, default=limits.MAX_BODY_BYTES,
                   help="larger request bodies get 413")
    p.add_argument("--timeout-request-headers", type=_positive_float, default=limits.HEADER_TIMEOUT_S,
                   metavar="SECONDS", help="a request whose line and headers are not all in this long after the "
                                           "connection opened (or after the previous response) gets 408 and the "
                                           "connection closes")
    p.add_argument("--timeout-request-body", type=_positive_float, default=limits.BODY_TIMEOUT_S,
                   metavar="SECONDS", help="a request body that sends nothing for this long gets 408 and the "
                                           "connection closes")
    p.add_argument("--timeout-keep-alive", type=_positive_int, default=limits.TIMEOUT_KEEP_ALIVE_S,
                   metavar="SECONDS", help="close an idle keep-alive connection after this long (uvicorn's option)")
    p.add_argument("--limit-concurrency", type=_positive_int, default=limits.LIMIT_CONCURRENCY, metavar="N",
                   help="with this many connections or requests open, new requests get 503 (uvicorn's option)")
    p.add_argument("--h11-max-incomplete-event-size", type=_positive_int,
                   default=limits.H11_MAX_INCOMPLETE_EVENT_SIZE, metavar="BYTES",
                   help="a longer request line and headers get 400 (uvicorn's option)")
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="use a chat template sent in a request (chat_template, chat_template_kwargs.chat_template); "
                        "without this flag such requests get 400 (vLLM's flag)")
    p.add_argument("--chat-template-timeout", type=_positive_float, default=limits.CHAT_TEMPLATE_TIMEOUT_S,
                   metavar="SECONDS", help="a chat template that renders for longer is stopped and the request "
                                           "gets 400 (templates render in worker processes)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let the model call tools on its own (tool_choice "auto"); needs --tool-call-parser')
    p.add_argument("--tool-call-parser", default=None, metavar="NAME",
                   help="how the model writes tool calls: hermes, llama3_json, mistral, qwen3_xml, qwen3_coder, "
                        "pythonic, openai, gemma4 (vLLM's names)")
    p.add_argument("--reasoning-parser", default=None, metavar="NAME",
                   help="split the model's reasoning from its answer (message.reasoning): qwen3, deepseek_r1, "
                        "deepseek_v3, glm45, openai (vLLM's names)")
    p.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                   help='do not show the tools to the chat template when tool_choice is "none"')
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    p.add_argument("--disable-access-log", action="store_true", help="do not log every request")
    p.add_argument("--lora-modules", nargs="+", type=_lora_module, default=None, metavar="NAME=PATH",
                   help='LoRA adapters served under their own model names (vLLM\'s flag): name=path, or JSON '
                        '{"name": ..., "path": ..., "base_model_name": ...}; needs --enable-lora')
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the startup request that compiles the kernels before /health says ready")
    EngineArgs.add_cli_args(p)


def _lora_module(text: str) -> dict:
    """--lora-modules' entry: name=path, or vLLM's JSON form."""
    import json
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
        if not isinstance(spec, dict) or not spec.get("name") or not spec.get("path"):
            raise argparse.ArgumentTypeError(f"{text}: needs a name and a path")
        return {"name": str(spec["name"]), "path": str(spec["path"]), "base_model_name": spec.get("base_model_name")}
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not name=path")
    return {"name": name, "path": path, "base_model_name": None}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def default_model_name(args_model: str | None, resolved: str) -> str:
    if args_model:
        return args_model
    name = Path(resolved).name
    return name[:-5] if name.endswith(".gguf") else name


def _warmup(llm_engine) -> None:
    """One short request through the engine, so kernel compilation happens before the port opens."""
    import time

    from engine.pooling.params import PoolingParams
    from engine.sample.sampling import SamplingParams
    t0 = time.perf_counter()
    tok = llm_engine.tokenizer
    ids = tok.encode("Hello") or [0]
    params = PoolingParams() if llm_engine.pooling is not None else SamplingParams(max_tokens=2, temperature=0.0,
                                                                                   ignore_eos=True)
    rid = llm_engine.add_request("__warmup__", {"prompt_token_ids": ids}, params)
    try:
        for _ in range(16):
            if not llm_engine.has_unfinished_requests():
                break
            llm_engine.step()
    finally:
        llm_engine.abort_request(rid)
    # /metrics counts client traffic only.
    llm_engine.num_prompt_tokens = llm_engine.num_generation_tokens = 0
    llm_engine.kv_manager.prefix_cache_queries = llm_engine.kv_manager.prefix_cache_hits = 0
    logging.getLogger("ramlm.server").info("warmed up in %.1f s", time.perf_counter() - t0)


def run_serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from engine.args import EngineArgs
    from engine.async_engine import AsyncLLMEngine
    from engine.engine import LLMEngine
    from engine.entrypoints.server.app import build_app
    from engine.entrypoints.server.connection import with_header_timeout
    from engine.entrypoints.server.metrics import ServerMetrics
    from engine.entrypoints.server.serving import ServerState
    from engine.entrypoints.server.template_worker import TemplateRenderer
    from engine.entrypoints.server.tool_calling import ToolConfig

    if ns.model_tag is not None:
        if ns.model is not None and ns.model != ns.model_tag:
            print(f"ramlm serve: got two models: {ns.model_tag!r} and --model {ns.model!r}", file=sys.stderr)
            return 2
        ns.model = ns.model_tag
    try:
        tools = ToolConfig(ns.enable_auto_tool_choice, ns.tool_call_parser, ns.reasoning_parser,
                           ns.exclude_tools_when_tool_choice_none)
    except ValueError as e:
        print(f"ramlm serve: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    args = EngineArgs.from_cli_args(ns)
    if ns.lora_modules and not args.enable_lora:
        print("ramlm serve: --lora-modules needs --enable-lora", file=sys.stderr)
        return 2
    from engine.lora.request import LoRARequest
    loras = {m["name"]: LoRARequest(m["name"], i + 1, m["path"], m["base_model_name"])
             for i, m in enumerate(ns.lora_modules or ())}

    def make_engine() -> LLMEngine:  # on the engine thread, where all its kernels will run
        llm_engine = LLMEngine(args)
        for lora in loras.values():  # a bad adapter stops the server before it opens its port
            llm_engine.check_lora(lora)
        llm_engine.import_torch_now()  # 1.5-3 s now rather than a GIL fight with the first requests' decode steps
        if not ns.no_warmup:
            _warmup(llm_engine)
        return llm_engine

    engine = AsyncLLMEngine.build(make_engine)
    llm_engine = engine.engine
    names = ns.served_model_name or [default_model_name(args.model, llm_engine.model_path)]
    clash = sorted(set(loras) & {*names, llm_engine.model_path})
    if clash:
        engine.shutdown()
        print(f"ramlm serve: LoRA adapter name(s) {', '.join(clash)} are the base model's", file=sys.stderr)
        return 2
    metrics = ServerMetrics(names[0], lambda: engine.snapshot)
    engine.set_hooks(on_first_token=metrics.on_first_token, on_finished=metrics.on_finished,
                     on_aborted=metrics.on_aborted)
    state = ServerState(engine=engine, model_names=list(names), model_path=llm_engine.model_path, metrics=metrics,
                        trust_request_chat_template=ns.trust_request_chat_template,
                        templates=TemplateRenderer(timeout_s=ns.chat_template_timeout), tools=tools,
                        lora_modules=loras)
    api_key = ns.api_key or envs.get("RAMLM_API_KEY") or None
    app = build_app(state, api_key=api_key, max_body_bytes=ns.max_request_body_bytes,
                    body_timeout_s=ns.timeout_request_body)
    logging.getLogger("ramlm.server").info(
        "serving %s as %s on http://%s:%d (max_model_len %d, %d KV blocks, API key %s); loaded in %.1f s",
        llm_engine.model_path, ", ".join(names), ns.host, ns.port, llm_engine.max_model_len,
        llm_engine.kv_manager.num_usable_blocks, "required" if api_key else "off", llm_engine.load_seconds)
    config = uvicorn.Config(app, host=ns.host, port=ns.port, log_level=ns.uvicorn_log_level,
                            access_log=not ns.disable_access_log, timeout_graceful_shutdown=5,
                            http=with_header_timeout(ns.timeout_request_headers),
                            timeout_keep_alive=ns.timeout_keep_alive, limit_concurrency=ns.limit_concurrency,
                            h11_max_incomplete_event_size=ns.h11_max_incomplete_event_size)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # Ctrl-C / SIGTERM: end the live streams (with an error event) so connections close in time.
            engine.stop_soon()
            super().handle_exit(sig, frame)

    Server(config).run()
    return 0
