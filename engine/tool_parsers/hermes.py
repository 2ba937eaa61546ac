"""Hermes / Qwen tool calls: <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks."""
from __future__ import annotations

import json
from typing import Optional

from engine.tool_parsers.base import ParsedTools, ToolCall, ToolParser, arguments_text, held_back

START, END = "<tool_call>", "</tool_call>"


def _read(body: str) -> Optional[ToolCall]:
    try:
        obj = json.loads(body)
        # Both keys are required, as in vLLM (a KeyError there turns the whole output into content).
        return ToolCall(obj["name"], arguments_text(obj["arguments"]))
    except (ValueError, KeyError, TypeError):
        return None


class HermesToolParser(ToolParser):
    """Content is the text before the first <tool_call>; text between and after calls is dropped (vLLM)."""
    names = ("hermes",)
    needs_special_tokens = True  # <tool_call> is a special token in Qwen vocabularies

    def parse(self, text: str, final: bool) -> ParsedTools:
        first = text.find(START)
        if first < 0:
            return ParsedTools(text if final else text[:len(text) - held_back(text, (START,))])
        calls: list[ToolCall] = []
        pos = first
        while pos >= 0:
            body_at = pos + len(START)
            end = text.find(END, body_at)
            body = text[body_at:] if end < 0 else text[body_at:end]
            if end < 0 and not final:
                body = body[:len(body) - held_back(body, (END,))]
            # An unclosed call still counts once its JSON is whole: the end tag may be a stop token left out of
            # the text, and a complete JSON object cannot grow into a different one.
            call = _read(body)
            if call is None:
                if final:  # vLLM: one unreadable call makes the whole output plain content
                    return ParsedTools(text)
                break
            calls.append(call)
            if end < 0:
                break
            pos = text.find(START, end + len(END))
        return ParsedTools(text[:first], tuple(calls))
