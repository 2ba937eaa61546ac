"""Tool calling and reasoning through the server with the official openai SDK: tool_choice required and named
(forced by a JSON schema), auto (the hermes parser on a constrained output), streamed calls equal to plain ones,
tool results in the chat template, the reasoning field, and 400s for tool choices that cannot be served."""
from __future__ import annotations

import json

import jsonschema_rs  # comes with schemathesis
import pytest

from tests.engine.entrypoints.server.conftest import MODEL

openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what time is it in Tokyo?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'


@pytest.fixture(scope="module")
def client(agent_server):
    with openai.OpenAI(base_url=agent_server.base_url + "/v1", api_key=agent_server.api_key, max_retries=0,
                       timeout=120) as c:
        yield c


def _create(client, **kw):
    kw.setdefault("extra_body", NO_THINKING)
    return client.chat.completions.create(model=MODEL, messages=kw.pop("messages", ASK), temperature=0,
                                          max_tokens=kw.pop("max_tokens", 120), **kw)


def _streamed(client, **kw) -> tuple[str, list[tuple[str, str, str]], str]:
    """(content, [(id, name, arguments)], finish_reason) reassembled from a stream's deltas."""
    content, calls, finish = "", {}, None
    for chunk in _create(client, stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for d in ch.delta.tool_calls or []:
            if d.id is not None:  # a call's first delta: id, type and name
                assert d.index not in calls and d.type == "function" and d.function.name
                calls[d.index] = [d.id, d.function.name, ""]
            calls[d.index][2] += d.function.arguments or ""
        finish = ch.finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


def _calls(message) -> list[tuple[str, str, str]]:
    return [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]


def _check_arguments(calls) -> None:
    for _, name, arguments in calls:
        assert jsonschema_rs.is_valid(SCHEMAS[name], json.loads(arguments)), (name, arguments)


def test_required_tool_choice_calls_tools_with_valid_arguments(client):
    """gemma-3-270m keeps adding calls to the array (max_tokens ends it); every complete one is valid."""
    r = _create(client, tools=TOOLS, tool_choice="required")
    msg = r.choices[0].message
    calls = _calls(msg)
    assert msg.content is None and len(calls) >= 2 and all(cid.startswith("call_") for cid, _, _ in calls)
    _check_arguments(calls)
    content, streamed, finish = _streamed(client, tools=TOOLS, tool_choice="required")
    assert content == "" and finish == r.choices[0].finish_reason
    assert [c[1:] for c in streamed] == [c[1:] for c in calls]  # ids are per response


def test_parallel_tool_calls_false_makes_one_call(client):
    r = _create(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert len(r.choices[0].message.tool_calls) == 1 and r.choices[0].finish_reason == "tool_calls"
    _check_arguments(_calls(r.choices[0].message))


def test_named_tool_choice_calls_that_function(client):
    choice = {"type": "function", "function": {"name": "get_time"}}
    r = _create(client, tools=TOOLS, tool_choice=choice)
    calls = _calls(r.choices[0].message)
    assert [c[1] for c in calls] == ["get_time"] and r.choices[0].finish_reason == "stop"
    _check_arguments(calls)
    content, streamed, finish = _streamed(client, tools=TOOLS, tool_choice=choice)
    assert [c[1:] for c in streamed] == [c[1:] for c in calls] and finish == "stop"


def test_auto_reads_the_models_tool_call_format(client):
    """The output is forced into hermes' format by a regex, so the parser's result is known exactly."""
    forced = {"chat_template_kwargs": {"enable_thinking": False},
              "structured_outputs": {"regex": "Checking\\.\n" + HERMES_CALL.replace("{", "\\{").replace("}", "\\}")}}
    r = _create(client, tools=TOOLS, tool_choice="auto", extra_body=forced)
    msg = r.choices[0].message
    assert msg.content == "Checking.\n" and r.choices[0].finish_reason == "tool_calls"
    assert [(n, json.loads(a)) for _, n, a in _calls(msg)] == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    content, streamed, finish = _streamed(client, tools=TOOLS, tool_choice="auto", extra_body=forced)
    assert (content, [c[1:] for c in streamed], finish) == (msg.content, [c[1:] for c in _calls(msg)], "tool_calls")


def test_tool_results_reach_the_chat_template(client, agent_server):
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                            "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"}]
    r = _create(client, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.tool_calls in (None, [])
    with agent_server.client() as http:
        ids = http.post("/tokenize", json={"model": MODEL, "messages": history}).json()["tokens"]
        text = http.post("/detokenize", json={"model": MODEL, "tokens": ids}).json()["prompt"]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>' in text
    assert '<tool_response id="call_1">18 degrees</tool_response>' in text


def test_reasoning_is_kept_apart_from_the_content(client):
    """Thinking on (the template opens a think block): with no </think> in 24 tokens all of it is reasoning
    (vLLM's qwen3 rule); thinking off (an empty think block in the prompt): all of it is content."""
    r = _create(client, extra_body={}, max_tokens=24)
    msg = r.choices[0].message
    reasoning = msg.model_extra["reasoning"]
    assert reasoning and msg.model_extra["reasoning_content"] == reasoning and msg.content == ""
    streamed = "".join(c.choices[0].delta.model_extra.get("reasoning") or "" for c in
                       _create(client, extra_body={}, max_tokens=24, stream=True) if c.choices)
    assert streamed == reasoning
    off = _create(client, max_tokens=24).choices[0].message
    assert off.content and off.model_extra["reasoning"] is None


@pytest.mark.parametrize("kw, message", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "Tool 'nope' has not"),
    ({"tool_choice": "required"}, "`tools` must be set"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot be combined"),
    ({"extra_body": {"functions": [WEATHER["function"]]}}, "functions and function_call"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}]}]},
     "not valid JSON"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "[" * 1100}}]}]},
     "nested too deeply"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": "abc"}}}]},
     "properties that are not an object"),
])
def test_tool_requests_that_cannot_be_served_get_400(client, kw, message):
    with pytest.raises(openai.BadRequestError) as e:
        _create(client, **kw)
    assert message in str(e.value)
    assert _create(client, max_tokens=4).choices[0].finish_reason in ("length", "stop")


def test_empty_arguments_in_the_history_are_no_arguments(client):
    """vLLM reads "" as {} (a call cut off before its arguments, say)."""
    history = ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "c", "content": "noon"}]
    assert _create(client, messages=history, max_tokens=2).choices[0].finish_reason in ("length", "stop")


def test_auto_needs_a_tool_call_parser(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0) as c:
        with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice"):
            c.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=4)
