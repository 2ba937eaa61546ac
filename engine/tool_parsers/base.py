"""What every tool-call parser is: text the model wrote -> (content, tool calls), for a finished output and for
a growing one (streaming).

The streaming contract (the server relies on it): for a well-formed output t and any prefix p of t,
parse(p, final=False).content is a prefix of parse(t, final=True).content, and parse(p, final=False).calls is a
prefix of parse(t, final=True).calls (a call is listed once it is complete, with its final arguments). So a
partial parse holds back any trailing text that could still become a tool-call marker.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, Optional


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # the arguments object as JSON text (json.dumps(..., ensure_ascii=False))


@dataclass(frozen=True)
class ParsedTools:
    content: str  # the message's text outside tool calls ("" when none)
    calls: tuple[ToolCall, ...] = ()
    # a partial parse may show the call being written, when its arguments text so far is a prefix of the final
    # one (streamed as argument deltas); formats that rewrite arguments (canonical JSON) leave it None
    partial: Optional[ToolCall] = None


class ToolParser:
    """A model family's tool-call format.

    names: the --tool-call-parser names it answers to (vLLM's).
    needs_special_tokens: its markers are special tokens, so the output must be detokenized with them kept
        (skip_special_tokens=False when tools are in play).
    reads_whole_output: parse the whole output even with a reasoning parser (its content is then the tool parser's).

    Args:
        tools: the request's tools in OpenAI's shape ({"type": "function", "function": {"name", "description",
            "parameters"}}), for formats that need the parameter types to read values (qwen3_xml).
    """
    names: ClassVar[tuple[str, ...]] = ()
    needs_special_tokens: ClassVar[bool] = False
    reads_whole_output: ClassVar[bool] = False

    def __init__(self, tools: Optional[list[dict]] = None):
        self.tools = tools or []

    def parse(self, text: str, final: bool) -> ParsedTools:
        raise NotImplementedError

    def parameters_of(self, name: str) -> dict:
        """The JSON schema of a tool's parameters ({} when unknown)."""
        for t in self.tools:
            fn = t.get("function", t)
            if fn.get("name") == name:
                params = fn.get("parameters")
                return params if isinstance(params, dict) else {}
        return {}


def dump_arguments(args: Any) -> str:
    """Arguments as OpenAI carries them: a JSON object's text."""
    return json.dumps(args if args is not None else {}, ensure_ascii=False)


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a marker (text a partial parse must
    not emit yet)."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


def arguments_text(args: Any) -> str:
    """dump_arguments for arguments a model wrote either as an object or as that object's JSON text (some models
    double-encode them)."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return dump_arguments(args)
