"""tool_choice "required" and a named function: the output is forced by a JSON schema (structured outputs), so
it reads the same whatever the model family (vLLM's approach)."""
from __future__ import annotations

import json
from typing import Optional

from engine.tool_parsers.base import ParsedTools, ToolCall, ToolParser, dump_arguments

NO_ARGUMENTS = {"type": "object", "properties": {}}


def function_of(tool: dict) -> dict:
    return tool.get("function", tool)


def required_schema(tools: list[dict], parallel: bool) -> dict:
    """A JSON array of one or more {"name", "parameters"} objects, each a call of one of the tools. The tools'
    $defs move to the top, where their "#/$defs/..." references point (vLLM's rule); ValueError when two tools
    define one name differently."""
    calls, defs = [], {}
    for t in tools:
        params = dict(function_of(t).get("parameters") or NO_ARGUMENTS)
        for name, schema in params.pop("$defs", {}).items():
            if defs.setdefault(name, schema) != schema:
                raise ValueError(f"tool_choice: tools define $defs.{name} differently; required cannot join them")
        calls.append({"type": "object", "properties": {"name": {"type": "string", "enum": [function_of(t)["name"]]},
                                                       "parameters": params},
                      "required": ["name", "parameters"], "additionalProperties": False})
    schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if defs:
        schema["$defs"] = defs
    if not parallel:
        schema["maxItems"] = 1
    return schema


class RequiredCalls(ToolParser):
    """The output is the JSON array of required_schema; a call is listed once its object is complete."""

    def parse(self, text: str, final: bool) -> ParsedTools:
        return ParsedTools("", tuple(_complete_calls(text)))


def _complete_calls(text: str) -> list[ToolCall]:
    decoder, calls = json.JSONDecoder(), []
    i = text.find("[")
    if i < 0:
        return calls
    i += 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] != "{":
            return calls
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:  # still being written (or cut off by max_tokens)
            return calls
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            calls.append(ToolCall(obj["name"], dump_arguments(obj.get("parameters"))))


class NamedCall(ToolParser):
    """The output is the named function's arguments object, kept as written (it streams as argument deltas)."""

    def __init__(self, tools: Optional[list[dict]], name: str):
        super().__init__(tools)
        self.name = name

    def parse(self, text: str, final: bool) -> ParsedTools:
        if not text:  # nothing written yet (or the output ended before its answer): no call
            return ParsedTools("")
        call = ToolCall(self.name, text)
        return ParsedTools("", (call,)) if final else ParsedTools("", (), partial=call)
