"""What the OpenAI and Anthropic handlers share: the server state, model and length checks, chat
rendering and tokenizing (off the event loop), adding requests, merging streams, disconnect handling,
SSE and logprob helpers."""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence

from fastapi import Request

from engine.async_engine import AsyncLLMEngine, EngineDeadError, EngineStepError, RequestStream
from engine.lora.request import LoRARequest
from engine.sample.sampling import SamplingParams
from engine.entrypoints.server.errors import APIError, bad_request, error_body, internal_error_message, \
    param_of_value_error
from engine.entrypoints.server.metrics import ServerMetrics
from engine.entrypoints.server.template_worker import TemplateError, TemplateRenderer
from engine.entrypoints.server.tool_calling import ToolConfig

SAMPLING_FIELDS = ("n", "best_of", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                   "presence_penalty", "frequency_penalty", "max_tokens", "min_tokens", "logprobs",
                   "top_logprobs", "prompt_logprobs", "stop", "stop_token_ids", "logit_bias", "seed",
                   "response_format", "structured_outputs")
LOGPROB_FLOOR = -9999.0  # JSON has no -inf
TOKENIZER_THREADS = min(8, os.cpu_count() or 1)  # the Rust tokenizer releases the GIL while it encodes
UNTRUSTED_TEMPLATE = ("Chat template is passed with request, but --trust-request-chat-template is not set. "
                      "Refused request with untrusted chat template.")  # vLLM's words
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")  # the template variables transformers sets
logger = logging.getLogger("ramlm.server")


def _tokenizer_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="ramlm-tokenize")


@dataclass
class ServerState:
    """What the routes share.

    trust_request_chat_template: use a template sent in the request (`chat_template`,
        `chat_template_kwargs.chat_template`) instead of refusing it (vLLM's flag of the same name).
    templates: renders chat templates in worker processes, with a time limit.
    tokenizer_pool: threads that tokenize and detokenize, so that big prompts do not stall the event loop.
    tools: the tool-call and reasoning parsers (--tool-call-parser, --reasoning-parser, ...).
    lora_modules: LoRA adapters a request's `model` names (--lora-modules, /v1/load_lora_adapter).
    """
    engine: AsyncLLMEngine
    model_names: list[str]
    model_path: str
    metrics: ServerMetrics
    created: int = field(default_factory=lambda: int(time.time()))
    trust_request_chat_template: bool = False
    templates: TemplateRenderer = field(default_factory=TemplateRenderer)
    tokenizer_pool: ThreadPoolExecutor = field(default_factory=_tokenizer_pool)
    tools: ToolConfig = field(default_factory=ToolConfig)
    lora_modules: dict[str, LoRARequest] = field(default_factory=dict)  # served adapters by name

    def next_lora_id(self) -> int:
        """A lora_int_id no adapter of this server had (ids are never reused: the prefix cache keys blocks by them)."""
        self._lora_ids = max([getattr(self, "_lora_ids", 0), *(r.lora_int_id for r in self.lora_modules.values())]) + 1
        return self._lora_ids

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def prefix_cache_block_size(self) -> Optional[int]:
        """Tokens per KV block when prefix caching is on (full blocks enter the cache), else None."""
        kv = self.engine.engine.kv_manager
        return kv.block_size if getattr(kv, "enable_prefix_caching", False) else None

    def check_model(self, name: Optional[str]) -> str:
        """The served name to report; 404 for a model this server does not serve (None = the default)."""
        if name is None or name == "" or name in self.model_names or name in self.lora_modules:
            return name or self.model_names[0]
        if name == self.model_path:
            return self.model_names[0]
        served = ", ".join([*self.model_names, *self.lora_modules])
        raise APIError(404, f"The model `{name}` does not exist. This server serves: {served}.",
                       param="model", code="model_not_found")

    def check_length(self, num_prompt: int, max_tokens: Optional[int], what: str) -> None:
        """400 unless the prompt and the requested completion fit in the context (vLLM's wording)."""
        limit = self.max_model_len
        if max_tokens is None:
            if num_prompt >= limit:
                raise bad_request(f"This model's maximum context length is {limit} tokens. However, your request "
                                  f"has {num_prompt} input tokens ({what}), which leaves no room for the completion. "
                                  f"Please reduce the length of the {what}.", what)
            return
        if num_prompt + max_tokens > limit:
            raise bad_request(f"This model's maximum context length is {limit} tokens. However, you requested "
                              f"{num_prompt + max_tokens} tokens ({num_prompt} in the {what}, {max_tokens} in the "
                              f"completion). Please reduce the length of the {what} or completion.", "max_tokens")

    async def off_loop(self, fn: Callable, *args, **kwargs) -> Any:
        """fn(*args, **kwargs) on a tokenizer thread."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_pool,
                                                                functools.partial(fn, *args, **kwargs))

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self.off_loop(self.tokenizer.encode, text, add_special_tokens=add_special_tokens)

    async def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                          continue_final_message: bool = False, template_kwargs: Optional[dict] = None,
                          request_template: Optional[str] = None, tools: Optional[list[dict]] = None
                          ) -> tuple[str, list[int]]:
        """Chat messages -> (prompt text, token ids), the template rendered in a worker process (a time limit,
        the event loop free). continue_final_message: the final message is left open for the model to continue
        (Anthropic's prefill; vLLM's and transformers' flag). A template from the request (request_template, or
        chat_template in template_kwargs) is refused unless the server trusts them."""
        tok = self.tokenizer
        kw = dict(template_kwargs or {})
        template = kw.pop("chat_template", None) or request_template
        if template is not None and not self.trust_request_chat_template:
            raise bad_request(UNTRUSTED_TEMPLATE, "chat_template")
        kw_tools, documents = kw.pop("tools", None), kw.pop("documents", None)
        tools = tools if tools is not None else kw_tools
        try:
            source = tok.get_chat_template(template, tools)
        except ValueError as e:  # no template at all, or several and none named 'default'
            raise bad_request(str(e), "chat_template") from e
        special = {k: v for k in SPECIAL_TOKENS if (v := getattr(tok, k, None))}
        try:
            text = await self.templates.render(source, messages, add_generation_prompt=add_generation_prompt,
                                               continue_final_message=continue_final_message, tools=tools,
                                               documents=documents, special_tokens=special, **kw)
        except TemplateError as e:  # jinja2.TemplateError (roles that do not alternate, ...), bad kwargs, time
            raise bad_request(f"the chat template rejected the messages: {e}", "messages") from e
        return text, await self.off_loop(self._chat_ids, text)

    def _chat_ids(self, text: str) -> list[int]:
        tok = self.tokenizer
        ids = tok.encode(text, add_special_tokens=False)  # the template writes BOS itself
        bos = getattr(tok, "bos_token_id", None)
        if getattr(tok, "add_bos_token", False) and bos is not None and ids[:1] != [bos]:
            ids = [bos] + ids
        return ids


def state_of(request: Request) -> ServerState:
    return request.app.state.ramlm


def sampling_params(make: Callable[[], SamplingParams]) -> SamplingParams:
    try:
        return make()
    except (ValueError, TypeError) as e:
        raise bad_request(str(e), param_of_value_error(str(e), SAMPLING_FIELDS)) from e


async def add_requests(st: ServerState, base_id: str, prompts: Sequence[tuple], params: SamplingParams,
                       model: Optional[str] = None) -> list[RequestStream]:
    """One engine request per prompt, all or nothing: each is checked as the engine would before any is
    queued, then all are queued at once (a rejected or cancelled one aborts the others). prompts: (text or None,
    token ids) or (text or None, token ids, token type ids). model: the served name the request asked for (a LoRA
    adapter's runs with it)."""
    lora = st.lora_modules.get(model) if model else None
    if model and lora is None and model not in st.model_names:  # an adapter unloaded since check_model
        raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")
    try:
        await st.off_loop(_validate_all, st.engine, prompts, params)
    except (ValueError, TypeError) as e:
        raise bad_request(str(e), param_of_value_error(str(e), SAMPLING_FIELDS)) from e
    adds = []
    for i, (text, ids, *types) in enumerate(prompts):
        rid = base_id if len(prompts) == 1 else f"{base_id}-{i}"
        p = params.clone() if len(prompts) > 1 else params
        prompt = {"prompt": text, "prompt_token_ids": ids, **({"token_type_ids": types[0]} if types else {})}
        adds.append(asyncio.ensure_future(st.engine.add_request(rid, prompt, p, lora_request=lora)))
    try:
        await asyncio.wait(adds)
    except BaseException:  # cancelled (the client left): nothing may stay queued
        for a in adds:
            if a.done() and not a.cancelled() and a.exception() is None:
                a.result().abort()
            else:
                a.cancel()  # a cancelled add aborts its request itself
        raise
    errors = [a.exception() for a in adds if not a.cancelled() and a.exception() is not None]
    if not errors:
        return [a.result() for a in adds]
    for a in adds:
        if not a.cancelled() and a.exception() is None:
            a.result().abort()
    e = errors[0]
    if isinstance(e, (ValueError, TypeError)):
        raise bad_request(str(e), param_of_value_error(str(e), SAMPLING_FIELDS)) from e
    if isinstance(e, EngineDeadError):
        raise APIError(503, str(e)) from e
    raise e


def _validate_all(engine: AsyncLLMEngine, prompts, params: SamplingParams) -> None:
    for prompt in prompts:
        engine.validate_request(prompt[1], params)


async def merge(streams: Sequence[RequestStream]) -> AsyncIterator[tuple[int, Any]]:
    """Yields (stream index, output) from several streams as they come; aborts them all on exit."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            streams[0].abort()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, s: RequestStream) -> None:
        try:
            async for out in s:
                queue.put_nowait((i, out))
        except Exception as e:
            queue.put_nowait((i, e))
        finally:
            queue.put_nowait((i, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()


async def collect(streams: Sequence[RequestStream]) -> list:
    finals: list = [None] * len(streams)
    async for i, out in merge(streams):
        finals[i] = out
    return finals


async def unless_disconnected(request: Request, work: Awaitable) -> tuple[bool, Any]:
    """Runs `work` but cancels it (aborting its requests) if the client disconnects first.
    Returns (completed, result)."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return True, task.result()
    return False, None


def stream_error(path: str, e: Exception, request_id: str) -> dict:
    """The error body sent inside an SSE stream when its request fails after streaming began; internals
    stay in the server log."""
    if isinstance(e, APIError):
        return error_body(path, e.status, e.message, e.param, e.code)
    if isinstance(e, EngineDeadError):
        return error_body(path, 503, str(e))
    if isinstance(e, EngineStepError):  # the engine thread logged it under its request id
        return error_body(path, 500, internal_error_message(e.request_id))
    logger.error("stream %s failed", request_id, exc_info=e)
    return error_body(path, 500, internal_error_message(request_id))


def sse(data: Any, event: Optional[str] = None) -> str:
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


# ---- logprobs ----
def clamp_logprob(x: Optional[float]) -> Optional[float]:
    if x is None:
        return None
    return LOGPROB_FLOOR if not math.isfinite(x) or x < LOGPROB_FLOOR else float(x)


def token_str(tokenizer, token_id: int, entry: Optional[dict]) -> str:
    lp = entry.get(token_id) if entry else None
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([token_id], skip_special_tokens=False)


def top_entries(entry: Optional[dict], k: int) -> list:
    """(token id, Logprob) of the k best-ranked, best first."""
    if not entry or k <= 0:
        return []
    ranked = sorted((lp.rank, t, lp) for t, lp in entry.items() if lp.rank is not None and lp.rank <= k)
    return [(t, lp) for _, t, lp in ranked[:k]]


def legacy_logprobs(tokenizer, token_ids: Sequence[int], entries: Sequence[Optional[dict]], k: int,
                    text_offset: int = 0) -> dict:
    """OpenAI's legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for tid, entry in zip(token_ids, entries):
        s = token_str(tokenizer, tid, entry)
        tokens.append(s)
        offsets.append(text_offset)
        text_offset += len(s)
        if entry is None:
            token_lps.append(None)
            tops.append(None)
            continue
        token_lps.append(clamp_logprob(entry[tid].logprob) if tid in entry else None)
        top = {token_str(tokenizer, t, entry): clamp_logprob(lp.logprob) for t, lp in top_entries(entry, k)}
        if tid in entry:
            top.setdefault(s, clamp_logprob(entry[tid].logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokenizer, token_ids: Sequence[int], entries: Sequence[Optional[dict]], k: int) -> list[dict]:
    """Chat completions' logprobs.content entries."""
    out = []
    for tid, entry in zip(token_ids, entries):
        s = token_str(tokenizer, tid, entry)
        lp = entry.get(tid) if entry else None
        out.append({"token": s, "logprob": clamp_logprob(lp.logprob) if lp else LOGPROB_FLOOR,
                    "bytes": list(s.encode("utf-8")),
                    "top_logprobs": [{"token": (ts := token_str(tokenizer, t, entry)),
                                      "logprob": clamp_logprob(tl.logprob), "bytes": list(ts.encode("utf-8"))}
                                     for t, tl in top_entries(entry, k)]})
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
