"""Mistral tool calls: [TOOL_CALLS] then a JSON list (pre-v11 tokenizers) or name[ARGS]{...} repeated (v11+)."""
from __future__ import annotations

import json
from typing import Optional

from engine.tool_parsers.base import ParsedTools, ToolCall, ToolParser, arguments_text, dump_arguments, held_back

BOT = "[TOOL_CALLS]"
_decoder = json.JSONDecoder()


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _list_calls(text: str, final: bool) -> Optional[list[ToolCall]]:
    """Pre-v11: [{"name": ..., "arguments": {...}}, ...]. Reads item by item so a partial parse can list the calls
    already closed; None when a final parse finds no well-formed list."""
    calls: list[ToolCall] = []
    i = _skip_space(text, text.index("[") + 1)
    while i < len(text):
        if text[i] == "]":
            return calls
        try:
            obj, i = _decoder.raw_decode(text, i)
            calls.append(ToolCall(obj["name"], arguments_text(obj.get("arguments", {}))))
        except (ValueError, KeyError, TypeError, AttributeError):
            break
        i = _skip_space(text, i)
        if text.startswith(",", i):
            i = _skip_space(text, i + 1)
    return None if final else calls


def _named_call(part: str) -> Optional[ToolCall]:
    """v11+: name[ARGS]{...} (the [ARGS] token may be absent). vLLM skips a part without '{' and keeps a call whose
    arguments are not JSON, with the arguments text as written, so the model sees what it tried."""
    brace = part.find("{")
    if brace < 0:
        return None
    name = part[:brace].replace("[ARGS]", "").split("[CALL_ID]")[0].strip()
    try:
        args, _ = _decoder.raw_decode(part, brace)  # trailing text (an end token) is not part of the arguments
        return ToolCall(name, dump_arguments(args))
    except ValueError:
        return ToolCall(name, part[brace:].strip())


class MistralToolParser(ToolParser):
    """Content is the text before the first [TOOL_CALLS]."""
    names = ("mistral",)
    needs_special_tokens = True  # [TOOL_CALLS] is a control token that skip_special_tokens would drop

    def parse(self, text: str, final: bool) -> ParsedTools:
        first = text.find(BOT)
        if first < 0:
            return ParsedTools(text if final else text[:len(text) - held_back(text, (BOT,))])
        content, rest = text[:first], text[first + len(BOT):]
        head = rest.lstrip()
        if not head:
            return ParsedTools(content)
        if head.startswith("["):
            calls = _list_calls(rest, final)
            if calls is None:  # vLLM gives the text back as content when the list is not JSON
                return ParsedTools(text)
            return ParsedTools(content, tuple(calls))
        parts = rest.split(BOT)
        calls = []
        for n, part in enumerate(parts):
            call = _named_call(part)
            # A partial parse lists the last call only once its arguments object is closed.
            if call is None or (not final and n == len(parts) - 1 and not _closed(part)):
                continue
            calls.append(call)
        return ParsedTools(content, tuple(calls))


def _closed(part: str) -> bool:
    try:
        _decoder.raw_decode(part, part.index("{"))
        return True
    except ValueError:
        return False
