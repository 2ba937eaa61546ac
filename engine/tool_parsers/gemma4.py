"""Gemma 4 tool calls: <|tool_call>call:name{key:<|"|>text<|"|>,n:3,nested:{...},list:[...]}<tool_call|>."""
from __future__ import annotations

import re
from typing import Any, Optional

from engine.tool_parsers.base import ParsedTools, ToolCall, ToolParser, dump_arguments, held_back

START, END, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_HEAD = re.compile(r"\s*call:([\w\-.]+)\{")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


def _bare(word: str) -> Any:
    """An unquoted value: a boolean, null, a number, else the word itself (vLLM's reading)."""
    if word in ("true", "false"):
        return word == "true"
    if word.lower() in ("null", "none", "nil"):
        return None
    if _NUMBER.fullmatch(word):
        return float(word) if any(c in word for c in ".eE") else int(word)
    return word


def _value(s: str, i: int) -> tuple[Any, int]:
    while s[i].isspace():
        i += 1
    if s.startswith(QUOTE, i):  # strings are quoted by the <|"|> token and hold anything, unescaped
        end = s.index(QUOTE, i + len(QUOTE))
        return s[i + len(QUOTE):end], end + len(QUOTE)
    if s[i] in "{[":
        closer, out = ("}", {}) if s[i] == "{" else ("]", [])
        i += 1
        while True:
            while s[i].isspace() or s[i] == ",":
                i += 1
            if s[i] == closer:
                return out, i + 1
            if closer == "]":
                item, i = _value(s, i)
                out.append(item)
                continue
            colon = s.index(":", i)  # keys are bare (or <|"|>-quoted) and end at the ':'
            key = s[i:colon].strip()
            if key.startswith(QUOTE) and key.endswith(QUOTE) and len(key) > 2 * len(QUOTE):
                key = key[len(QUOTE):-len(QUOTE)]
            out[key], i = _value(s, colon + 1)
    end = i
    while end < len(s) and s[end] not in ",}]":
        end += 1
    if end == len(s) or end == i:
        raise ValueError("unterminated value")
    return _bare(s[i:end].strip()), end


def _read(body: str) -> Optional[ToolCall]:
    head = _HEAD.match(body)
    try:
        args, end = _value(body, head.end() - 1)
        if body[end:].strip():
            return None
        return ToolCall(head.group(1), dump_arguments(args))
    except (AttributeError, ValueError, IndexError, RecursionError):
        return None


class Gemma4ToolParser(ToolParser):
    """Content is the text before the first <|tool_call> with its trailing whitespace stripped (vLLM strips both
    ends; the leading side is kept so a stream need not hold back the answer's opening); text between and after
    calls (<|tool_response> ...) is dropped. Malformed calls are skipped; none readable leaves it all content."""
    names = ("gemma4", "gemma")
    needs_special_tokens = True

    def parse(self, text: str, final: bool) -> ParsedTools:
        first = text.find(START)
        if first < 0:
            if final:
                return ParsedTools(text)
            # Trailing whitespace waits: it is dropped if a call follows.
            return ParsedTools(text[:len(text) - held_back(text, (START,))].rstrip())
        calls: list[ToolCall] = []
        pos = first
        while pos >= 0:
            end = text.find(END, pos)
            if end < 0 and not final:
                break
            # An unclosed call at the end of a final parse still reads when whole (the end may be a stop token).
            call = _read(text[pos + len(START):end if end >= 0 else len(text)])
            if call is not None:
                calls.append(call)
            pos = text.find(START, end) if end >= 0 else -1
        if final and not calls:
            return ParsedTools(text)
        return ParsedTools(text[:first].rstrip(), tuple(calls))
