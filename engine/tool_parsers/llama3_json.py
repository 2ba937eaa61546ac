"""Llama 3.x JSON tool calls: [<|python_tag|>]{"name": ..., "parameters": {...}}; {...} as the whole output."""
from __future__ import annotations

import json

from engine.tool_parsers.base import ParsedTools, ToolCall, ToolParser, arguments_text

TAG = "<|python_tag|>"
_decoder = json.JSONDecoder()


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


class Llama3JsonToolParser(ToolParser):
    """Tool calls only when the output opens with <|python_tag|> or '{' (as vLLM's streaming path decides);
    otherwise it is all content. Text after the last call is dropped; a JSON object that is not a call turns the
    whole output back into content (vLLM)."""
    names = ("llama3_json", "llama4_json")

    def parse(self, text: str, final: bool) -> ParsedTools:
        i = _skip_space(text, 0)
        if text.startswith(TAG, i):
            i = _skip_space(text, i + len(TAG))
        elif not text.startswith("{", i):
            if not final and TAG.startswith(text[i:]):  # blank so far, or a partial tag: may still open a call
                return ParsedTools("")
            return ParsedTools(text)
        calls: list[ToolCall] = []
        while i < len(text):
            try:
                obj, i = _decoder.raw_decode(text, i)
                args = obj["arguments"] if "arguments" in obj else obj["parameters"]
                calls.append(ToolCall(obj["name"], arguments_text(args)))
            except (ValueError, KeyError, TypeError):
                # Not (yet) a call: a partial parse waits; a final one gives the text back as content.
                if final:
                    return ParsedTools(text)
                break
            i = _skip_space(text, i)
            if not text.startswith(";", i):
                break  # whatever follows the calls is not part of the message (vLLM ignores it)
            i = _skip_space(text, i + 1)
        if final and not calls:
            return ParsedTools(text)
        return ParsedTools("", tuple(calls))
