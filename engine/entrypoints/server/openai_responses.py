"""OpenAI's Responses API, stateless: POST /v1/responses, plain and streamed (response.created ...
response.completed), with function tools and reasoning items (the chat API's tool plan and parsers)."""
from __future__ import annotations

import time
import uuid
from typing import Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.entrypoints.server import openapi, tool_calling
from engine.entrypoints.server.errors import bad_request
from engine.entrypoints.server.message_parsing import Delta, Message, MessageStream
from engine.entrypoints.server.openai import SSE_HEADERS
from engine.entrypoints.server.responses_protocol import ResponsesRequest
from engine.entrypoints.server.responses_api_models import ResponseObject, ResponseStreamEvent
from engine.entrypoints.server.serving import (ServerState, add_requests, collect, merge, sampling_params, sse,
                                               state_of, stream_error, unless_disconnected)
from engine.entrypoints.server.tool_calling import ToolPlan

router = APIRouter()
PATH = "/v1/responses"


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _plan(st: ServerState, body: ResponsesRequest, params) -> ToolPlan:
    try:
        body.check_stateless()
        tp = tool_calling.plan(st.tools, body.openai_tools(), body.openai_tool_choice(),
                               body.parallel_tool_calls is not False, body.template_kwargs(),
                               params.structured_outputs is not None)
    except ValueError as e:
        raise bad_request(str(e), str(e).split(":")[0]) from e
    tp.apply(params)
    return tp


@router.post(PATH, response_model=ResponseObject,
             responses={**openapi.streamed(ResponseStreamEvent, done_marker=False),
                        **openapi.errors(*openapi.GENERATION_ERRORS)})
async def create_response(body: ResponsesRequest, request: Request):
    st = state_of(request)
    model = st.check_model(body.model)
    params = sampling_params(body.to_sampling_params)
    tp = _plan(st, body, params)
    try:
        messages = body.messages()
    except ValueError as e:
        raise bad_request(str(e).replace("messages:", "input:"), "input") from e
    _, ids = await st.render_chat(messages, template_kwargs=body.template_kwargs(), tools=tp.template_tools)
    st.check_length(len(ids), body.max_output_tokens, "input")
    rid = _item_id("resp")
    added, streams = await unless_disconnected(request, add_requests(st, rid, [(None, ids)], params, model))
    if not added:
        return Response(status_code=499)
    shell = _Shell(st, body, model, rid, int(time.time()), len(ids))
    if body.stream:
        return StreamingResponse(_stream(shell, tp, streams), media_type="text/event-stream", headers=SSE_HEADERS)
    completed, finals = await unless_disconnected(request, collect(streams))
    if not completed:
        return Response(status_code=499)
    out = finals[0]
    c = out.outputs[0]
    msg = tp.parser.parse(c.text)
    return JSONResponse(shell.response(_items(msg, c.finish_reason == "length"), c, out.num_cached_tokens))


class _Shell:
    """The parts of the response object that do not depend on the output."""

    def __init__(self, st: ServerState, body: ResponsesRequest, model: str, rid: str, created: int, num_prompt: int):
        self.body, self.model, self.id, self.created, self.num_prompt = body, model, rid, created, num_prompt
        self.tokenizer = st.tokenizer

    def reasoning_tokens(self, output: list[dict]) -> int:
        """Tokens of the reasoning items' text (the usage's output_tokens_details)."""
        text = "".join(p["text"] for item in output if item["type"] == "reasoning" for p in item["content"])
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def response(self, output: list[dict], c=None, num_cached: Optional[int] = None) -> dict:
        b = self.body
        status, incomplete, usage = "in_progress", None, None
        if c is not None:
            status = "incomplete" if c.finish_reason == "length" else "completed"
            incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
            usage = {"input_tokens": self.num_prompt, "input_tokens_details": {"cached_tokens": num_cached or 0},
                     "output_tokens": len(c.token_ids),
                     "output_tokens_details": {"reasoning_tokens": min(self.reasoning_tokens(output),
                                                                       len(c.token_ids))},
                     "total_tokens": self.num_prompt + len(c.token_ids)}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "incomplete_details": incomplete, "error": None,
                "instructions": b.instructions, "max_output_tokens": b.max_output_tokens,
                "parallel_tool_calls": b.parallel_tool_calls is not False,
                "temperature": 1.0 if b.temperature is None else b.temperature,
                "top_p": 1.0 if b.top_p is None else b.top_p,
                "tool_choice": "auto" if b.tool_choice is None else (
                    b.tool_choice if isinstance(b.tool_choice, str) else b.tool_choice.model_dump()),
                "tools": [t.model_dump(exclude_none=True) for t in b.tools or []],
                "text": {"format": {"type": "text"}} if b.text is None else b.text.model_dump(exclude_none=True,
                                                                                              by_alias=True),
                "reasoning": b.reasoning.model_dump() if b.reasoning else None, "store": False,
                "metadata": b.metadata or {}, "truncation": "disabled", "usage": usage}


def _reasoning_item(text: str, status: str = "completed", iid: Optional[str] = None) -> dict:
    return {"type": "reasoning", "id": iid or _item_id("rs"), "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else []}


def _message_item(text: str, status: str = "completed", iid: Optional[str] = None) -> dict:
    return {"type": "message", "id": iid or _item_id("msg"), "role": "assistant", "status": status,
            "content": [_text_part(text)] if status == "completed" else []}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(call_id: str, name: str, arguments: str, status: str = "completed", iid: Optional[str] = None) -> dict:
    return {"type": "function_call", "id": iid or _item_id("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _items(msg: Message, cut: bool) -> list[dict]:
    """cut: the output stopped at max_output_tokens, so its last item is incomplete."""
    out = []
    if msg.reasoning:
        out.append(_reasoning_item(msg.reasoning))
    if msg.content or not (msg.calls or msg.reasoning):  # an empty message only when nothing else was written
        out.append(_message_item(msg.content))
    out += [_call_item(cid, call.name, call.arguments) for cid, call in msg.calls]
    if cut:
        out[-1]["status"] = "incomplete"
    return out


class _Events:
    """Streamed deltas -> the Responses API's events: an output item per run of reasoning, text or a call."""

    def __init__(self, shell: _Shell):
        self.shell, self.seq, self.done_items = shell, 0, []
        self.kind, self.item, self.text = None, None, ""

    def event(self, kind: str, **fields) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(data, kind)

    def opening(self) -> list[str]:
        shell = self.shell.response([])
        return [self.event("response.created", response=shell), self.event("response.in_progress", response=shell)]

    def delta(self, d) -> list[str]:
        out = []
        if d.kind == "call" or d.kind != self.kind and not (d.kind == "arguments" and self.kind == "call"):
            out += self.close()
            out += self._open(d)
        if not d.text:
            return out
        self.text += d.text
        where = {"item_id": self.item["id"], "output_index": len(self.done_items)}
        if self.kind == "reasoning":
            out.append(self.event("response.reasoning_text.delta", **where, content_index=0, delta=d.text))
        elif self.kind == "content":
            out.append(self.event("response.output_text.delta", **where, content_index=0, delta=d.text, logprobs=[]))
        else:
            out.append(self.event("response.function_call_arguments.delta", **where, delta=d.text))
        return out

    def _open(self, d) -> list[str]:
        self.kind, self.text = d.kind, ""
        if d.kind == "reasoning":
            self.item = _reasoning_item("", "in_progress")
        elif d.kind == "content":
            self.item = _message_item("", "in_progress")
        else:
            self.kind, self.item = "call", _call_item(d.id, d.name, "", "in_progress")
        index = len(self.done_items)
        out = [self.event("response.output_item.added", output_index=index, item=self.item)]
        if self.kind == "content":
            out.append(self.event("response.content_part.added", item_id=self.item["id"], output_index=index,
                                  content_index=0, part=_text_part("")))
        return out

    def close(self, cut: bool = False) -> list[str]:
        """cut: the output stopped at max_output_tokens inside this item."""
        if self.kind is None:
            return []
        iid, index, text, out = self.item["id"], len(self.done_items), self.text, []
        where = {"item_id": iid, "output_index": index}
        if self.kind == "reasoning":
            item = _reasoning_item(text, iid=iid)
            out.append(self.event("response.reasoning_text.done", **where, content_index=0, text=text))
        elif self.kind == "content":
            item = _message_item(text, iid=iid)
            out.append(self.event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]))
            out.append(self.event("response.content_part.done", **where, content_index=0, part=_text_part(text)))
        else:
            item = _call_item(self.item["call_id"], self.item["name"], text, iid=iid)
            out.append(self.event("response.function_call_arguments.done", **where, name=item["name"],
                                  arguments=text))
        if cut:
            item["status"] = "incomplete"
        out.append(self.event("response.output_item.done", output_index=index, item=item))
        self.done_items.append(item)
        self.kind = self.item = None
        return out

    def closing(self, c, num_cached: Optional[int]) -> list[str]:
        cut = c.finish_reason == "length"
        out = self.close(cut)
        if not self.done_items:  # nothing was written: an empty message, as the plain response has
            out += self._open(Delta("content")) + self.close(cut)
        response = self.shell.response(self.done_items, c, num_cached)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return out + [self.event(kind, response=response)]


async def _stream(shell: _Shell, tp: ToolPlan, streams):
    events, message = _Events(shell), MessageStream(tp.parser)
    try:
        for e in events.opening():
            yield e
        last = None
        async for _, out in merge(streams):
            last = out
            c = out.outputs[0]
            for d in message.update(c.text, c.finish_reason is not None):
                for e in events.delta(d):
                    yield e
        for e in events.closing(last.outputs[0], last.num_cached_tokens):
            yield e
    except Exception as e:
        yield sse(stream_error(PATH, e, shell.id), "error")
