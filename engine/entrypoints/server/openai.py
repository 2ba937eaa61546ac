"""OpenAI-compatible /v1/completions and /v1/chat/completions (plain and SSE streaming)."""
from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.entrypoints.server import openapi, tool_calling
from engine.entrypoints.server.errors import bad_request
from engine.entrypoints.server.message_parsing import Delta, MessageStream
from engine.entrypoints.server.tool_calling import ToolPlan
from engine.entrypoints.server.protocol import ChatCompletionRequest, CompletionRequest
from engine.entrypoints.server.responses import (ChatCompletionChunk, ChatCompletionResponse, CompletionChunk,
                                                 CompletionResponse)
from engine.entrypoints.server.serving import (ServerState, add_requests, chat_logprobs, collect, legacy_logprobs, merge,
                                   sampling_params, sse, state_of, stream_error, unless_disconnected, usage)

router = APIRouter()
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _prompts(st: ServerState, prompt) -> list[tuple[Optional[str], list[int]]]:
    """The four prompt forms -> [(text or None, token ids)]; text is tokenized off the event loop."""
    tok = st.tokenizer
    if isinstance(prompt, str):
        return [(prompt, await st.encode(prompt))]
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    if isinstance(prompt[0], str):
        return list(zip(prompt, await st.off_loop(lambda: [tok.encode(p) for p in prompt])))
    if isinstance(prompt[0], int):
        return [(None, list(prompt))]
    return [(None, list(p)) for p in prompt]


def _echo_text(st: ServerState, text: Optional[str], ids: list[int]) -> str:
    return text if text is not None else st.tokenizer.decode(ids)


@router.post("/v1/completions", response_model=CompletionResponse,
             responses={**openapi.streamed(CompletionChunk, done_marker=True), **openapi.errors(*openapi.GENERATION_ERRORS)})
async def create_completion(body: CompletionRequest, request: Request):
    st = state_of(request)
    model = st.check_model(body.model)
    if body.suffix:
        raise bad_request("suffix is not supported", "suffix")
    params = sampling_params(body.to_sampling_params)
    prompts = await _prompts(st, body.prompt)
    for _, ids in prompts:
        st.check_length(len(ids), body.max_tokens, "prompt")
    rid = f"cmpl-{uuid.uuid4().hex}"
    added, streams = await unless_disconnected(request, add_requests(st, rid, prompts, params, model))
    if not added:
        return Response(status_code=499)
    created = int(time.time())
    if body.stream:
        return StreamingResponse(_completion_stream(st, body, model, rid, created, prompts, streams),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    completed, finals = await unless_disconnected(request, collect(streams))
    if not completed:
        return Response(status_code=499)
    n, k = body.n, body.logprobs
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for pi, (out, (text, ids)) in enumerate(zip(finals, prompts)):
        prompt_tokens += len(ids)
        for c in out.outputs:
            completion_tokens += len(c.token_ids)
            prefix = _echo_text(st, text, ids) if body.echo else ""
            lp = None
            if k is not None:
                tok_ids, entries = list(c.token_ids), list(c.logprobs or [None] * len(c.token_ids))
                if body.echo:
                    tok_ids = ids + tok_ids
                    entries = list(out.prompt_logprobs or [None] * len(ids)) + entries
                lp = legacy_logprobs(st.tokenizer, tok_ids, entries, k)
            choices.append({"index": pi * n + c.index, "text": prefix + c.text, "logprobs": lp,
                            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
    choices.sort(key=lambda ch: ch["index"])
    return JSONResponse({"id": rid, "object": "text_completion", "created": created, "model": model,
                         "choices": choices, "usage": usage(prompt_tokens, completion_tokens)})


async def _completion_stream(st, body: CompletionRequest, model, rid, created, prompts, streams):
    n, k = body.n, body.logprobs
    sent_chars: dict = {}
    sent_toks: dict = {}
    done: set = set()
    prompt_tokens = sum(len(ids) for _, ids in prompts)
    completion_tokens: dict = {}
    try:
        async for pi, out in merge(streams):
            text, ids = prompts[pi]
            for c in out.outputs:
                key = (pi, c.index)
                if key in done:
                    continue
                first = key not in sent_chars
                delta = c.text[sent_chars.get(key, 0):]
                new_ids = list(c.token_ids[sent_toks.get(key, 0):])
                if not first and not delta and not new_ids and c.finish_reason is None:
                    continue
                lp_ids, lp_entries = new_ids, list((c.logprobs or [])[sent_toks.get(key, 0):len(c.token_ids)])
                offset = sent_chars.get(key, 0) + (sent_chars.get(("echo",) + key, 0))
                if first and body.echo:
                    prefix = _echo_text(st, text, ids)
                    sent_chars[("echo",) + key] = len(prefix)
                    delta = prefix + delta
                    lp_ids = ids + lp_ids
                    lp_entries = list(out.prompt_logprobs or [None] * len(ids)) + lp_entries
                lp = None
                if k is not None:
                    lp_entries += [None] * (len(lp_ids) - len(lp_entries))
                    lp = legacy_logprobs(st.tokenizer, lp_ids, lp_entries, k, offset)
                sent_chars[key] = len(c.text)
                sent_toks[key] = len(c.token_ids)
                completion_tokens[key] = len(c.token_ids)
                chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
                         "choices": [{"index": pi * n + c.index, "text": delta, "logprobs": lp,
                                      "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}]}
                if body.include_usage and body.stream_options.continuous_usage_stats:
                    chunk["usage"] = usage(prompt_tokens, sum(completion_tokens.values()))
                yield sse(chunk)
                if c.finish_reason is not None:
                    done.add(key)
        if body.include_usage:
            yield sse({"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
                       "usage": usage(prompt_tokens, sum(completion_tokens.values()))})
    except Exception as e:
        yield sse(stream_error("/v1/completions", e, rid))
    yield "data: [DONE]\n\n"


def chat_tool_plan(st: ServerState, body: ChatCompletionRequest, params) -> ToolPlan:
    """The request's tool plan, applied to its sampling params (the forcing schema, special tokens kept for
    parsers whose markers are special tokens); 400 for a tool choice that cannot be served."""
    if body.functions is not None or body.function_call is not None:
        raise bad_request("functions and function_call are not supported (OpenAI deprecated them): send tools and "
                          "tool_choice", "functions")
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools is not None else None
    choice = body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump") else body.tool_choice
    constrained = params.structured_outputs is not None
    try:
        tp = tool_calling.plan(st.tools, tools, choice, body.parallel_tool_calls is not False,
                               body.chat_template_kwargs, constrained, continuing=body.continue_final_message)
    except ValueError as e:
        raise bad_request(str(e), "tool_choice") from e
    tp.apply(params)
    return tp


def chat_messages(body) -> list[dict]:
    try:
        return [m.to_template() for m in body.messages]
    except ValueError as e:
        raise bad_request(str(e), "messages") from e


def _finish_reason(tp: ToolPlan, c, has_calls: bool) -> Optional[str]:
    """tool_calls when the model called tools on its own or as required (OpenAI's; a named choice says stop)."""
    if has_calls and c.finish_reason == "stop" and tp.choice in ("auto", "required"):
        return "tool_calls"
    return c.finish_reason


def message_json(tp: ToolPlan, msg) -> dict:
    """An assistant message in chat completions' shape: content null when it only called tools."""
    out: dict = {"role": "assistant", "content": msg.content if msg.content or not msg.calls else None}
    if tp.parser.reasoning is not None:
        out["reasoning"] = out["reasoning_content"] = msg.reasoning
    out["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                         for cid, call in msg.calls]
    return out


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             responses={**openapi.streamed(ChatCompletionChunk, done_marker=True), **openapi.errors(*openapi.GENERATION_ERRORS)})
async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    st = state_of(request)
    model = st.check_model(body.model)
    params = sampling_params(body.to_sampling_params)
    tp = chat_tool_plan(st, body, params)
    _, ids = await st.render_chat(chat_messages(body), body.add_generation_prompt, body.continue_final_message,
                                  body.chat_template_kwargs, body.chat_template, tp.template_tools)
    st.check_length(len(ids), body.requested_max_tokens, "messages")
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    added, streams = await unless_disconnected(request, add_requests(st, rid, [(None, ids)], params, model))
    if not added:
        return Response(status_code=499)
    created = int(time.time())
    if body.stream:
        return StreamingResponse(_chat_stream(st, body, tp, model, rid, created, len(ids), streams),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    completed, finals = await unless_disconnected(request, collect(streams))
    if not completed:
        return Response(status_code=499)
    out = finals[0]
    k = body.top_logprobs or 0
    choices = []
    for c in out.outputs:
        lp = {"content": chat_logprobs(st.tokenizer, c.token_ids, c.logprobs or [], k)} if body.logprobs else None
        msg = replace(tp.parser, _ids=[]).parse(c.text)
        choices.append({"index": c.index, "message": message_json(tp, msg), "logprobs": lp,
                        "finish_reason": _finish_reason(tp, c, bool(msg.calls)), "stop_reason": c.stop_reason})
    return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": model,
                         "choices": choices,
                         "usage": usage(len(ids), sum(len(c.token_ids) for c in out.outputs))})


def _delta_json(d: Delta) -> dict:
    if d.kind == "content":
        return {"content": d.text}
    if d.kind == "reasoning":
        return {"reasoning": d.text, "reasoning_content": d.text}
    if d.kind == "call":
        return {"tool_calls": [{"index": d.index, "id": d.id, "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}


async def _chat_stream(st, body: ChatCompletionRequest, tp: ToolPlan, model, rid, created, prompt_tokens, streams):
    k = body.top_logprobs or 0
    sent_toks: dict = {}
    done: set = set()
    completion_tokens: dict = {}
    messages = {i: MessageStream(replace(tp.parser, _ids=[])) for i in range(body.n)}
    called: set = set()

    def chunk(choices, usage_=None):
        c = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}
        if usage_ is not None:
            c["usage"] = usage_
        return sse(c)

    try:
        for i in range(body.n):  # the role comes first, as OpenAI sends it
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}])
        async for _, out in merge(streams):
            for c in out.outputs:
                if c.index in done:
                    continue
                a, b = sent_toks.get(c.index, 0), len(c.token_ids)
                finished = c.finish_reason is not None
                deltas = messages[c.index].update(c.text, finished)
                if not deltas and a == b and not finished:
                    continue
                if any(d.kind == "call" for d in deltas):
                    called.add(c.index)
                lp = None
                if body.logprobs:
                    lp = {"content": chat_logprobs(st.tokenizer, c.token_ids[a:b], (c.logprobs or [])[a:b], k)}
                sent_toks[c.index] = completion_tokens[c.index] = b
                u = None
                if body.include_usage and body.stream_options.continuous_usage_stats:
                    u = usage(prompt_tokens, sum(completion_tokens.values()))
                parts = [_delta_json(d) for d in deltas] or [{}]
                for j, delta in enumerate(parts):
                    last = j == len(parts) - 1
                    yield chunk([{"index": c.index, "delta": delta, "logprobs": lp if j == 0 else None,
                                  "finish_reason": _finish_reason(tp, c, c.index in called) if last else None,
                                  "stop_reason": c.stop_reason if last else None}], u if last else None)
                if finished:
                    done.add(c.index)
        if body.include_usage:
            yield chunk([], usage(prompt_tokens, sum(completion_tokens.values())))
    except Exception as e:
        yield sse(stream_error("/v1/chat/completions", e, rid))
    yield "data: [DONE]\n\n"
