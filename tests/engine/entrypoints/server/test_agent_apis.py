"""Tools and reasoning through the anthropic SDK (tool_use and tool_result blocks, thinking blocks, streamed
events) and the Responses API through the openai SDK's client.responses.create (plain, streamed, a function tool
round trip)."""
from __future__ import annotations

import json

import jsonschema_rs  # comes with schemathesis
import pytest

from tests.engine.entrypoints.server.conftest import MODEL
from tests.engine.entrypoints.server.test_tool_calling_api import ASK, TOOLS, WEATHER

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

CLAUDE_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                 "input_schema": t["function"]["parameters"]} for t in TOOLS]
SCHEMAS = {t["name"]: t["input_schema"] for t in CLAUDE_TOOLS}
OFF = {"type": "disabled"}
GREEDY = {"temperature": 0}  # the anthropic SDK (2.x) has no temperature argument any more
RESPONSES_TOOL = {"type": "function", **WEATHER["function"]}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def claude(agent_server):
    with anthropic.Anthropic(base_url=agent_server.base_url, api_key=agent_server.api_key, max_retries=0,
                             timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(agent_server):
    with openai.OpenAI(base_url=agent_server.base_url + "/v1", api_key=agent_server.api_key, max_retries=0,
                       timeout=120) as c:
        yield c


def _tool_uses(message) -> list[tuple[str, dict]]:
    return [(b.name, b.input) for b in message.content if b.type == "tool_use"]


def test_messages_tool_use_plain_and_streamed(claude):
    kw = dict(model=MODEL, max_tokens=120, extra_body=GREEDY, messages=ASK, tools=CLAUDE_TOOLS, thinking=OFF,
              tool_choice={"type": "any", "disable_parallel_tool_use": True})
    m = claude.messages.create(**kw)
    uses = _tool_uses(m)
    assert m.stop_reason == "tool_use" and len(uses) == 1
    assert all(b.id.startswith("toolu_") for b in m.content if b.type == "tool_use")
    assert jsonschema_rs.is_valid(SCHEMAS[uses[0][0]], uses[0][1])
    with claude.messages.stream(**kw) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert _tool_uses(final) == uses and final.stop_reason == "tool_use"
    assert events[:2] == ["message_start", "content_block_start"] and "input_json" in events


def test_messages_named_tool_and_tool_result_round_trip(claude):
    m = claude.messages.create(model=MODEL, max_tokens=120, extra_body=GREEDY, messages=ASK, tools=CLAUDE_TOOLS,
                               thinking=OFF, tool_choice={"type": "tool", "name": "get_time"})
    ((name, args),) = _tool_uses(m)
    assert name == "get_time" and jsonschema_rs.is_valid(SCHEMAS[name], args)
    tool_use = next(b for b in m.content if b.type == "tool_use")
    follow = ASK + [{"role": "assistant", "content": [{"type": "tool_use", "id": tool_use.id, "name": name,
                                                       "input": args}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id,
                                                  "content": "09:30"}]}]
    count = claude.messages.count_tokens(model=MODEL, messages=follow, tools=CLAUDE_TOOLS, thinking=OFF).input_tokens
    reply = claude.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=follow, tools=CLAUDE_TOOLS,
                                   thinking=OFF, tool_choice={"type": "none"})
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens + reply.usage.cache_creation_input_tokens \
        == count
    assert reply.content[0].type == "text" and reply.stop_reason in ("end_turn", "max_tokens")


def test_messages_thinking_blocks(claude):
    kw = dict(model=MODEL, max_tokens=1100, extra_body=GREEDY,
              messages=[{"role": "user", "content": "Tell me about Paris."}],
              thinking={"type": "enabled", "budget_tokens": 1024}, stop_sequences=["\n"])  # max_tokens > budget
    m = claude.messages.create(**kw)
    assert m.content[0].type == "thinking" and m.content[0].thinking and m.stop_reason == "stop_sequence"
    with claude.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert final.content[0].thinking == m.content[0].thinking


def test_a_prefill_is_continued_as_the_answer(claude):
    """The reply continues the last assistant message: answer text, not reasoning (the prompt's think block is
    closed before it)."""
    m = claude.messages.create(model=MODEL, max_tokens=6, extra_body=GREEDY, thinking=OFF, messages=[
        {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "A colour:"}])
    assert [b.type for b in m.content] == ["text"] and m.content[0].text


def test_messages_tool_errors_are_400(claude, server):
    with pytest.raises(anthropic.BadRequestError, match="tool_result block cannot be in a assistant"):
        claude.messages.create(model=MODEL, max_tokens=8, messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "1"}]}])
    with pytest.raises(anthropic.BadRequestError, match="has not been passed"):
        claude.messages.create(model=MODEL, max_tokens=8, messages=ASK, tools=CLAUDE_TOOLS,
                               tool_choice={"type": "tool", "name": "nope"})
    with anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0) as plain:
        with pytest.raises(anthropic.BadRequestError, match="--reasoning-parser"):
            plain.messages.create(model=MODEL, max_tokens=2048, messages=ASK,
                                  thinking={"type": "enabled", "budget_tokens": 1024})
    with pytest.raises(anthropic.BadRequestError, match="less than max_tokens"):
        claude.messages.create(model=MODEL, max_tokens=8, messages=ASK, thinking={"type": "enabled",
                                                                                 "budget_tokens": 1024})


def test_responses_plain_and_streamed(client):
    kw = dict(model=MODEL, input="Say hello.", instructions="Be brief.", max_output_tokens=12, temperature=0,
              extra_body=NO_THINKING)
    r = client.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[-1].status == "incomplete"
    assert r.output_text and r.usage.output_tokens == 12
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text


def test_responses_function_tool_round_trip(client):
    kw = dict(model=MODEL, tools=[RESPONSES_TOOL], max_output_tokens=80, temperature=0, extra_body=NO_THINKING)
    r = client.responses.create(input="What is the weather in Paris?", tool_choice="required",
                                parallel_tool_calls=False, **kw)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and r.status == "completed" and r.tool_choice == "required"
    assert jsonschema_rs.is_valid(RESPONSES_TOOL["parameters"], json.loads(call.arguments))
    events = list(client.responses.create(input="What is the weather in Paris?", tool_choice="required",
                                          parallel_tool_calls=False, stream=True, **kw))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert [(d.name, d.arguments) for d in done] == [(call.name, call.arguments)] and args == call.arguments
    follow = client.responses.create(input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees and sunny"}],
        tool_choice="none", **{**kw, "max_output_tokens": 8})
    assert follow.output[-1].type == "message" and follow.output_text


def test_responses_reasoning_item(client):
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=12, temperature=0)
    assert r.output[0].type == "reasoning" and r.output[0].content[0].text
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens


@pytest.mark.parametrize("kw, message", [
    ({"store": True}, "keeps no responses"),
    ({"previous_response_id": "resp_1"}, "keeps no responses"),
    ({"tools": [RESPONSES_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "has not been passed"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{x"}]},
     "not valid JSON"),
])
def test_responses_requests_that_cannot_be_served_get_400(client, kw, message):
    with pytest.raises(openai.BadRequestError, match=message):
        client.responses.create(model=MODEL, **{"input": "Hi", "max_output_tokens": 4, **kw})
