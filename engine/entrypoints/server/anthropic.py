"""Anthropic Messages API: POST /v1/messages (plain and streaming) and /v1/messages/count_tokens.

Streaming sends message_start (once the request is scheduled, when its prefix-cache hit is known), then per
content block (thinking with --reasoning-parser, text, tool_use) content_block_start, content_block_delta
(thinking_delta, text_delta, input_json_delta)..., content_block_stop, a ping after the first block's start, then
message_delta (stop_reason, usage) and message_stop. Tools and tool_choice (auto, any, tool, none) go through the
chat API's tool plan (tool_calling.py). A last assistant message is a prefill: the reply continues it.
`usage` splits the prompt as Anthropic does: cache_read_input_tokens (prefix-cache hits),
cache_creation_input_tokens (full blocks computed and cached here) and input_tokens (the rest).
"""
from __future__ import annotations

import json
import uuid
from typing import Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.entrypoints.server import openapi, tool_calling
from engine.entrypoints.server.errors import bad_request
from engine.entrypoints.server.message_parsing import Delta, MessageParser, MessageStream
from engine.entrypoints.server.tool_calling import ToolPlan
from engine.entrypoints.server.protocol import CountTokensRequest, MessagesRequest, content_text
from engine.entrypoints.server.responses import AnthropicStreamEvent, CountTokensResponse, MessagesResponse
from engine.entrypoints.server.serving import (ServerState, add_requests, collect, merge, sampling_params, sse, state_of,
                                   stream_error, unless_disconnected)

router = APIRouter()
PATH = "/v1/messages"


def _messages(body) -> list[dict]:
    """Anthropic messages -> chat-template messages: tool_result blocks become tool messages, tool_use blocks the
    assistant's tool_calls, thinking blocks its reasoning."""
    out = []
    if body.system:
        out.append({"role": "system", "content": content_text(body.system)})
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        misplaced = {"user": ("tool_use", "thinking"), "assistant": ("tool_result",)}[m.role]
        for b in m.content:
            if b.type in misplaced:
                raise bad_request(f"messages.{i}: a {b.type} block cannot be in a {m.role} message", "messages")
        text = content_text(m.content)
        if m.role == "user":
            results = [b for b in m.content if b.type == "tool_result"]
            out += [{"role": "tool", "tool_call_id": b.tool_use_id, "content": content_text(b.content),
                     **({"is_error": True} if b.is_error else {})} for b in results]
            if text or not results:
                out.append({"role": "user", "content": text})
            continue
        msg = {"role": "assistant", "content": text}
        calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
                 for b in m.content if b.type == "tool_use"]
        if calls:
            msg["tool_calls"] = calls
        thinking = "".join(b.thinking for b in m.content if b.type == "thinking")
        if thinking:
            msg["reasoning"] = msg["reasoning_content"] = thinking
        out.append(msg)
    return out


def _thinking_kwargs(st: ServerState, body) -> Optional[dict]:
    """`thinking` as the chat template's switches (Qwen's enable_thinking, DeepSeek's thinking)."""
    if body.thinking is None:
        return None
    on = body.thinking.type == "enabled"
    if on and st.tools.reasoning_parser is None:
        raise bad_request("thinking needs the server to run with --reasoning-parser", "thinking")
    budget = body.thinking.budget_tokens
    if on and (budget is None or budget >= getattr(body, "max_tokens", budget + 1)):
        # Anthropic's rules; the reasoning then ends within max_tokens, which holds reasoning and answer together
        raise bad_request("thinking.budget_tokens is required and must be less than max_tokens", "thinking")
    return {"enable_thinking": on, "thinking": on}


def _plan(st: ServerState, body) -> ToolPlan:
    """Tools, tool_choice and thinking as the chat API's tool plan (400 for what cannot be served)."""
    kwargs = _thinking_kwargs(st, body)
    choice = body.tool_choice
    try:
        return tool_calling.plan(st.tools, [t.to_openai() for t in body.tools] if body.tools else None,
                                 choice.to_openai() if choice is not None else None,
                                 not (choice is not None and choice.disable_parallel_tool_use), kwargs, False,
                                 id_prefix="toolu_", continuing=_prefill(body))
    except ValueError as e:
        raise bad_request(str(e), "tool_choice") from e


def _prefill(body) -> bool:
    """A last assistant message (without tool calls) is continued by the reply."""
    last = body.messages[-1]
    return last.role == "assistant" and (isinstance(last.content, str)
                                         or not any(b.type == "tool_use" for b in last.content))


async def _render(st: ServerState, body, tp: ToolPlan) -> list[int]:
    msgs = _messages(body)
    prefill = _prefill(body)
    _, ids = await st.render_chat(msgs, add_generation_prompt=not prefill, continue_final_message=prefill,
                                  template_kwargs=_thinking_kwargs(st, body), tools=tp.template_tools)
    return ids


def _input_usage(st: ServerState, num_prompt: int, num_cached: Optional[int]) -> dict:
    """Anthropic's split of the prompt: tokens read from the prefix cache, tokens written to it (the prompt's
    full KV blocks this request computed, which later requests can reuse) and the rest (input_tokens)."""
    read = num_cached or 0
    block_size = st.prefix_cache_block_size
    written = max(num_prompt // block_size * block_size - read, 0) if block_size else 0
    return {"input_tokens": num_prompt - read - written, "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read}


def _stop(c, called: bool, stop_sequences) -> tuple[str, object]:
    if c.finish_reason == "length":
        return "max_tokens", None
    if isinstance(c.stop_reason, str) and c.stop_reason in (stop_sequences or ()):
        return "stop_sequence", c.stop_reason
    return ("tool_use" if called else "end_turn"), None  # the end token, or the end of a forcing grammar


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:  # a call cut off by max_tokens
        return {}
    return value if isinstance(value, dict) else {}


def _content(msg) -> list[dict]:
    blocks = []
    if msg.reasoning:
        blocks.append({"type": "thinking", "thinking": msg.reasoning, "signature": ""})
    if msg.content or not (msg.calls or msg.reasoning):  # an empty text block only when nothing else was written
        blocks.append({"type": "text", "text": msg.content})
    blocks += [{"type": "tool_use", "id": cid, "name": call.name, "input": _input(call.arguments)}
               for cid, call in msg.calls]
    return blocks


@router.post(PATH, response_model=MessagesResponse,
             responses={**openapi.streamed(AnthropicStreamEvent, done_marker=False),
                        **openapi.errors(*openapi.GENERATION_ERRORS, anthropic=True)})
async def create_message(body: MessagesRequest, request: Request):
    st = state_of(request)
    model = st.check_model(body.model)
    params = sampling_params(body.to_sampling_params)
    tp = _plan(st, body)
    tp.apply(params)
    ids = await _render(st, body, tp)
    st.check_length(len(ids), body.max_tokens, "messages")
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    added, streams = await unless_disconnected(request, add_requests(st, mid, [(None, ids)], params, model))
    if not added:
        return Response(status_code=499)
    if body.stream:
        return StreamingResponse(_stream(st, model, mid, len(ids), streams, tp.parser, body.stop_sequences),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    completed, finals = await unless_disconnected(request, collect(streams))
    if not completed:
        return Response(status_code=499)
    c = finals[0].outputs[0]
    msg = tp.parser.parse(c.text)
    stop_reason, stop_sequence = _stop(c, bool(msg.calls), body.stop_sequences)
    return JSONResponse({"id": mid, "type": "message", "role": "assistant", "model": model,
                         "content": _content(msg), "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                         "usage": {**_input_usage(st, len(ids), finals[0].num_cached_tokens),
                                   "output_tokens": len(c.token_ids)}})


_BLOCKS = {"reasoning": ({"type": "thinking", "thinking": "", "signature": ""}, "thinking_delta", "thinking"),
           "content": ({"type": "text", "text": ""}, "text_delta", "text"),
           "arguments": (None, "input_json_delta", "partial_json")}


class _Blocks:
    """Streamed deltas -> Anthropic's content block events (a block per run of reasoning, text or a tool call)."""

    def __init__(self):
        self.index, self.kind = -1, None

    def events(self, d) -> list[str]:
        out = []
        kind = "arguments" if d.kind == "call" else d.kind
        if d.kind == "call" or kind != self.kind:
            out += self.close()
            self.index, self.kind = self.index + 1, kind
            block = ({"type": "tool_use", "id": d.id, "name": d.name, "input": {}} if d.kind == "call"
                     else _BLOCKS[kind][0])
            out.append(sse({"type": "content_block_start", "index": self.index, "content_block": block},
                           "content_block_start"))
            if self.index == 0:
                out.append(sse({"type": "ping"}, "ping"))
        if d.text:
            _, delta_type, field = _BLOCKS[kind]
            out.append(sse({"type": "content_block_delta", "index": self.index,
                            "delta": {"type": delta_type, field: d.text}}, "content_block_delta"))
        return out

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        return [sse({"type": "content_block_stop", "index": self.index}, "content_block_stop")]


async def _stream(st: ServerState, model: str, mid: str, num_prompt: int, streams, parser: MessageParser,
                  stop_sequences):
    try:
        last, input_usage, blocks, called = None, None, _Blocks(), False
        message = MessageStream(parser)
        async for _, out in merge(streams):
            if input_usage is None:  # the prefix-cache hit is known once the request was scheduled
                input_usage = _input_usage(st, num_prompt, out.num_cached_tokens)
                yield _message_start(model, mid, input_usage)
            last = out.outputs[0]
            for d in message.update(last.text, last.finish_reason is not None):
                called |= d.kind == "call"
                for event in blocks.events(d):
                    yield event
        if blocks.index < 0:  # nothing was written: one empty text block
            for event in blocks.events(Delta("content")):
                yield event
        for event in blocks.close():
            yield event
        stop_reason, stop_sequence = _stop(last, called, stop_sequences)
        yield sse({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                   "usage": {**input_usage, "output_tokens": len(last.token_ids)}}, "message_delta")
        yield sse({"type": "message_stop"}, "message_stop")
    except Exception as e:
        yield sse(stream_error(PATH, e, mid), "error")


def _message_start(model: str, mid: str, input_usage: dict) -> str:
    start = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
             "stop_sequence": None, "usage": {**input_usage, "output_tokens": 0}}
    return sse({"type": "message_start", "message": start}, "message_start")


@router.post(PATH + "/count_tokens", response_model=CountTokensResponse,
             responses=openapi.errors(*openapi.REQUEST_ERRORS, anthropic=True))
async def count_tokens(body: CountTokensRequest, request: Request):
    st = state_of(request)
    st.check_model(body.model)
    return {"input_tokens": len(await _render(st, body, _plan(st, body)))}
