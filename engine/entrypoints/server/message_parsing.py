"""An assistant's text -> reasoning, content and tool calls (the configured reasoning parser first, then the tool
parser on what is left), whole or as the deltas of a stream, for every API (chat completions, Messages,
Responses)."""
from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Optional

from engine.reasoning.base import ReasoningParser
from engine.tool_parsers.base import ParsedTools, ToolCall, ToolParser

_ALNUM = string.ascii_letters + string.digits


def new_call_id(prefix: str = "call_", length: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(length))


@dataclass(frozen=True)
class Message:
    reasoning: Optional[str]
    content: str
    calls: tuple[tuple[str, ToolCall], ...]  # (id, call)


@dataclass(frozen=True)
class Delta:
    """One piece of a streamed message: kind is reasoning, content, call (a new call: index, id, name) or
    arguments (more of call index's arguments text)."""
    kind: str
    text: str = ""
    index: int = 0
    id: str = ""
    name: str = ""


@dataclass
class MessageParser:
    reasoning: Optional[ReasoningParser] = None
    tools: Optional[ToolParser] = None
    id_prefix: str = "call_"
    max_calls: Optional[int] = None  # parallel_tool_calls false: the first call only (vLLM's rule)
    _ids: list = field(default_factory=list)  # call ids in order, stable across partial and final parses

    @property
    def needs_special_tokens(self) -> bool:
        return any(p is not None and p.needs_special_tokens for p in (self.reasoning, self.tools))

    def _split(self, text: str, final: bool) -> tuple[Optional[str], ParsedTools]:
        reasoning, content = None, text
        if self.reasoning is not None:
            r = self.reasoning.split(text, final)
            reasoning, content = r.reasoning, r.content
        if self.tools is None:
            return reasoning, ParsedTools(content)
        source = text if self.tools.reads_whole_output else content
        parsed = self._parse_tools(source, final)
        if final:  # calls a stream already sent stay, even when a cut-off last call makes the format give up
            partial = self._parse_tools(source, False)
            if len(partial.calls) > len(parsed.calls):
                parsed = ParsedTools(partial.content, partial.calls)
        if self.max_calls is not None and len(parsed.calls) >= self.max_calls:
            parsed = ParsedTools(parsed.content, parsed.calls[:self.max_calls])
        return reasoning, parsed

    def _parse_tools(self, text: str, final: bool) -> ParsedTools:
        try:
            return self.tools.parse(text, final)
        except RecursionError:  # JSON nested past Python's limit: no call can be read from it
            return ParsedTools(text if final else "")

    def _id(self, i: int) -> str:
        while len(self._ids) <= i:
            self._ids.append(new_call_id(self.id_prefix))
        return self._ids[i]

    def parse(self, text: str) -> Message:
        """The finished output."""
        reasoning, parsed = self._split(text, True)
        return Message(reasoning, parsed.content, tuple((self._id(i), c) for i, c in enumerate(parsed.calls)))


class MessageStream:
    """Deltas of a growing output; all of them put together give MessageParser.parse of the final text."""

    def __init__(self, parser: MessageParser):
        self.parser = parser
        self.sent = {"reasoning": 0, "content": 0}  # characters sent
        self.calls_sent = 0  # calls sent whole
        self.open_args = -1  # arguments characters sent of call number calls_sent; -1: not announced yet

    def update(self, text: str, final: bool) -> list[Delta]:
        reasoning, parsed = self.parser._split(text, final)
        out = self._text("reasoning", reasoning or "") + self._text("content", parsed.content)
        for i in range(self.calls_sent, len(parsed.calls)):
            out += self._call(i, parsed.calls[i])
            self.calls_sent, self.open_args = i + 1, -1
        if parsed.partial is not None and not final:
            out += self._call(len(parsed.calls), parsed.partial)
        return out

    def _text(self, kind: str, text: str) -> list[Delta]:
        n = self.sent[kind]
        if len(text) <= n:
            return []
        self.sent[kind] = len(text)
        return [Delta(kind, text[n:])]

    def _call(self, i: int, call: ToolCall) -> list[Delta]:
        out = []
        if self.open_args < 0:
            out.append(Delta("call", index=i, id=self.parser._id(i), name=call.name))
            self.open_args = 0
        if len(call.arguments) > self.open_args:
            out.append(Delta("arguments", call.arguments[self.open_args:], index=i))
            self.open_args = len(call.arguments)
        return out
