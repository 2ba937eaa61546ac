"""The assistant message split every API shares: streamed deltas put together equal the finished parse, for
every tool parser's recorded outputs, with and without a reasoning parser in front, and for the forced tool
choices (required: calls as their objects complete; named: arguments streamed as written)."""
from __future__ import annotations

import json

import pytest

from engine.entrypoints.server.message_parsing import MessageParser, MessageStream
from engine.reasoning import get_reasoning_parser
from engine.tool_parsers import get_tool_parser
from engine.tool_parsers.forced import NamedCall, RequiredCalls, required_schema
from tests.engine.tool_parsers.test_tool_parsers import CASES, TOOLS


def _replay(parser: MessageParser, text: str, step: int = 1) -> tuple[str, str, list]:
    """(reasoning, content, [(id, name, arguments)]) put together from the deltas of text growing by step."""
    stream, reasoning, content, calls = MessageStream(parser), "", "", {}
    ends = list(range(step, len(text), step)) + [len(text)]
    for end in ends:
        for d in stream.update(text[:end], end == len(text)):
            if d.kind == "reasoning":
                reasoning += d.text
            elif d.kind == "content":
                content += d.text
            elif d.kind == "call":
                assert d.index == len(calls) and d.id
                calls[d.index] = [d.id, d.name, ""]
            else:
                calls[d.index][2] += d.text
    return reasoning, content, [tuple(calls[i]) for i in sorted(calls)]


def _expected(parser: MessageParser, text: str) -> tuple[str, str, list]:
    msg = parser.parse(text)
    return msg.reasoning or "", msg.content, [(cid, c.name, c.arguments) for cid, c in msg.calls]


WELL_FORMED = [(names, case, text) for names, case, text, _, _, ok in CASES if ok]


@pytest.mark.parametrize("names, case, text", WELL_FORMED, ids=[f"{n}-{c}" for n, c, _ in WELL_FORMED])
@pytest.mark.parametrize("step", [1, 7])
def test_streamed_deltas_equal_the_parse(names, case, text, step):
    name = names[0] if isinstance(names, tuple) else names
    parser = MessageParser(None, get_tool_parser(name)(TOOLS))
    assert _replay(parser, text, step) == _expected(parser, text)  # the same ids: one parser, ids by position


def test_reasoning_then_tool_calls():
    text = ('<think>\nThe user wants the weather.\n</think>\n\nLet me look.\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Oslo"}}\n</tool_call>')
    parser = MessageParser(get_reasoning_parser("qwen3")({}), get_tool_parser("hermes")(TOOLS))
    reasoning, content, calls = _replay(parser, text)
    assert reasoning == "\nThe user wants the weather.\n" and content == "\n\nLet me look.\n"
    assert [(n, json.loads(a)) for _, n, a in calls] == [("get_weather", {"city": "Oslo"})]
    assert (reasoning, content, calls) == _expected(parser, text)


def test_harmony_calls_beside_the_analysis_channel():
    text = ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary '
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "SF"}<|call|>')
    parser = MessageParser(get_reasoning_parser("openai")(), get_tool_parser("openai")(TOOLS))
    reasoning, content, calls = _replay(parser, text)
    assert (reasoning, content) == ("Need the weather.", "")
    assert [(n, json.loads(a)) for _, n, a in calls] == [("get_weather", {"city": "SF"})]


def test_required_calls_arrive_as_their_objects_complete():
    text = ('[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
            '{"name": "search", "parameters": {"query": "x"}}]')
    parser = MessageParser(None, RequiredCalls(TOOLS))
    stream, seen = MessageStream(parser), []
    for end in range(1, len(text) + 1):
        seen.append(sum(d.kind == "call" for d in stream.update(text[:end], end == len(text))))
    assert sum(seen) == 2 and seen.index(1) == text.index("}}") + 1  # the first call once its object closed
    assert [(n, json.loads(a)) for _, n, a in _replay(parser, text)[2]] == [
        ("get_weather", {"city": "Paris"}), ("search", {"query": "x"})]
    schema = required_schema(TOOLS, parallel=False)
    assert schema["maxItems"] == 1 and schema["minItems"] == 1


def test_named_call_streams_its_arguments_as_written():
    text = '{\n  "city": "Paris"\n}'
    parser = MessageParser(None, NamedCall(TOOLS, "get_weather"))
    stream = MessageStream(parser)
    first = stream.update(text[:5], False)
    assert [d.kind for d in first] == ["call", "arguments"] and first[1].text == text[:5]
    assert _replay(parser, text) == ("", "", [(parser._ids[0], "get_weather", text)])


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "A"}}\n</tool_call>\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "B"}}\n</tool_call>')
    parser = MessageParser(None, get_tool_parser("hermes")(TOOLS), max_calls=1)
    assert [json.loads(a)["city"] for _, _, a in _replay(parser, text)[2]] == ["A"]


def test_a_cut_off_last_call_keeps_the_calls_already_sent():
    """A stream cannot take back a call it sent: the final parse keeps complete calls when the last one is cut off
    (the format alone would give the whole text back as content)."""
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "A"}}\n</tool_call>\n<tool_call>\n'
            '{"name": "get_weather", "argu')
    parser = MessageParser(None, get_tool_parser("hermes")(TOOLS))
    reasoning, content, calls = _replay(parser, text)
    assert (reasoning, content, calls) == _expected(parser, text)
    assert [json.loads(a) for _, _, a in calls] == [{"city": "A"}] and content == ""


def test_arguments_nested_past_the_recursion_limit_are_text():
    text = '<tool_call>\n{"name": "get_weather", "arguments": ' + "[" * 5000 + "\n</tool_call>"
    parser = MessageParser(None, get_tool_parser("hermes")(TOOLS))
    assert _replay(parser, text, step=997) == _expected(parser, text) == ("", text, [])


def test_required_schema_lifts_the_tools_defs():
    ref = {"type": "object", "properties": {"at": {"$ref": "#/$defs/Place"}}, "$defs": {
        "Place": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    tools = [{"type": "function", "function": {"name": n, "parameters": ref}} for n in ("a", "b")]
    schema = required_schema(tools, parallel=True)
    assert schema["$defs"] == ref["$defs"]
    assert all("$defs" not in c["properties"]["parameters"] for c in schema["items"]["anyOf"])
    other = {**ref, "$defs": {"Place": {"type": "string"}}}
    with pytest.raises(ValueError, match=r"\$defs.Place differently"):
        required_schema(tools + [{"type": "function", "function": {"name": "c", "parameters": other}}], True)


def test_a_named_call_with_nothing_written_is_no_call():
    parser = MessageParser(None, NamedCall(TOOLS, "get_weather"))
    assert parser.parse("").calls == () and MessageStream(parser).update("", False) == []
