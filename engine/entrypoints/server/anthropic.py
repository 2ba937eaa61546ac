"""Anthropic Messages API: POST /v1/messages (plain and streaming) and /v1/messages/count_tokens.

Streaming sends message_start, content_block_start, ping (once the request is scheduled, when its
prefix-cache hit is known), content_block_delta (text_delta)..., content_block_stop, message_delta
(stop_reason, usage), message_stop. A last assistant message is a prefill: the reply continues it.
`usage` splits the prompt as Anthropic does: cache_read_input_tokens (prefix-cache hits),
cache_creation_input_tokens (full blocks computed and cached here) and input_tokens (the rest).
"""
from __future__ import annotations

import uuid
from typing import Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.entrypoints.server import openapi
from engine.entrypoints.server.protocol import CountTokensRequest, MessagesRequest, content_text
from engine.entrypoints.server.responses import AnthropicStreamEvent, CountTokensResponse, MessagesResponse
from engine.entrypoints.server.serving import (ServerState, add_requests, collect, merge, sampling_params, sse, state_of,
                                   stream_error, unless_disconnected)

router = APIRouter()
PATH = "/v1/messages"


def _messages(body) -> list[dict]:
    out = []
    if body.system:
        out.append({"role": "system", "content": content_text(body.system)})
    out += [{"role": m.role, "content": content_text(m.content)} for m in body.messages]
    return out


async def _render(st: ServerState, body) -> list[int]:
    msgs = _messages(body)
    prefill = msgs[-1]["role"] == "assistant"
    _, ids = await st.render_chat(msgs, add_generation_prompt=not prefill, continue_final_message=prefill)
    return ids


def _input_usage(st: ServerState, num_prompt: int, num_cached: Optional[int]) -> dict:
    """Anthropic's split of the prompt: tokens read from the prefix cache, tokens written to it (the prompt's
    full KV blocks this request computed, which later requests can reuse) and the rest (input_tokens)."""
    read = num_cached or 0
    block_size = st.prefix_cache_block_size
    written = max(num_prompt // block_size * block_size - read, 0) if block_size else 0
    return {"input_tokens": num_prompt - read - written, "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read}


def _stop(c) -> tuple[str, object]:
    if c.finish_reason == "length":
        return "max_tokens", None
    if isinstance(c.stop_reason, str):
        return "stop_sequence", c.stop_reason
    return "end_turn", None


@router.post(PATH, response_model=MessagesResponse,
             responses={**openapi.streamed(AnthropicStreamEvent, done_marker=False),
                        **openapi.errors(*openapi.GENERATION_ERRORS, anthropic=True)})
async def create_message(body: MessagesRequest, request: Request):
    st = state_of(request)
    model = st.check_model(body.model)
    params = sampling_params(body.to_sampling_params)
    ids = await _render(st, body)
    st.check_length(len(ids), body.max_tokens, "messages")
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    added, streams = await unless_disconnected(request, add_requests(st, mid, [(None, ids)], params))
    if not added:
        return Response(status_code=499)
    if body.stream:
        return StreamingResponse(_stream(st, model, mid, len(ids), streams), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    completed, finals = await unless_disconnected(request, collect(streams))
    if not completed:
        return Response(status_code=499)
    c = finals[0].outputs[0]
    stop_reason, stop_sequence = _stop(c)
    return JSONResponse({"id": mid, "type": "message", "role": "assistant", "model": model,
                         "content": [{"type": "text", "text": c.text}], "stop_reason": stop_reason,
                         "stop_sequence": stop_sequence,
                         "usage": {**_input_usage(st, len(ids), finals[0].num_cached_tokens),
                                   "output_tokens": len(c.token_ids)}})


async def _stream(st: ServerState, model: str, mid: str, num_prompt: int, streams):
    try:
        sent, last, input_usage = 0, None, None
        async for _, out in merge(streams):
            if input_usage is None:  # the prefix-cache hit is known once the request was scheduled
                input_usage = _input_usage(st, num_prompt, out.num_cached_tokens)
                for event in _opening_events(model, mid, input_usage):
                    yield event
            c = out.outputs[0]
            last = c
            if len(c.text) > sent:
                yield sse({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": c.text[sent:]}}, "content_block_delta")
                sent = len(c.text)
        yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        stop_reason, stop_sequence = _stop(last)
        yield sse({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                   "usage": {**input_usage, "output_tokens": len(last.token_ids)}}, "message_delta")
        yield sse({"type": "message_stop"}, "message_stop")
    except Exception as e:
        yield sse(stream_error(PATH, e, mid), "error")


def _opening_events(model: str, mid: str, input_usage: dict) -> list[str]:
    start = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
             "stop_sequence": None, "usage": {**input_usage, "output_tokens": 0}}
    return [sse({"type": "message_start", "message": start}, "message_start"),
            sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                "content_block_start"),
            sse({"type": "ping"}, "ping")]


@router.post(PATH + "/count_tokens", response_model=CountTokensResponse,
             responses=openapi.errors(*openapi.REQUEST_ERRORS, anthropic=True))
async def count_tokens(body: CountTokensRequest, request: Request):
    st = state_of(request)
    st.check_model(body.model)
    return {"input_tokens": len(await _render(st, body))}
