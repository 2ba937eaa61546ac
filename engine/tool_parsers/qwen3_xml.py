"""Qwen3 XML tool calls: <tool_call><function=name><parameter=p>value</parameter>...</function></tool_call>."""
from __future__ import annotations

import ast
import json
import math
import re
from typing import Any, Optional

from engine.tool_parsers.base import ParsedTools, ToolCall, ToolParser, dump_arguments, held_back

TC, FN, PARAM = "<tool_call>", "<function=", "<parameter="
# A call closes where </function> is followed by </tool_call>: a lone </tool_call> may be literal text in a value.
_CALL_END = re.compile(r"</function>\s*</tool_call>")
_PARAM_AT = re.compile(r"(?:^|(?<=\n))<parameter=([^>\n]*)>")  # tags open lines; mid-line ones are value text
# A </parameter> closes a value when another parameter or the function's end follows (else it is value text).
_PARAM_END = re.compile(r"</parameter>(?=\s*(?:<parameter=|\Z))")
_BAD_NAME = set("{}<>\"' \t\n\r")
_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")


def _type_of(schema: Any) -> tuple[str, bool]:
    """(primary type, whether null is allowed) of a parameter schema; untyped reads as string."""
    if not isinstance(schema, dict):
        return "string", False
    options = schema["type"] if "type" in schema else [o.get("type") for o in schema.get("anyOf", [])
                                                       if isinstance(o, dict)]
    options = [str(t).strip().lower() for t in (options if isinstance(options, list) else [options]) if t]
    primary = [t for t in options if t != "null"]
    return (primary[0] if primary else ("null" if options else "string")), "null" in options


def convert(value: str, schema: Any) -> Any:
    """A parameter's text as its schema type, as vLLM's qwen3_coder does; what does not read stays a string."""
    kind, nullable = _type_of(schema)
    if value.lower() in ("null", "none") and (nullable or kind not in _STRING_TYPES):
        return None
    try:
        if kind in _STRING_TYPES:
            return value
        if kind.startswith(("int", "uint", "long", "short", "unsigned")):
            return int(value)
        if kind.startswith(("num", "float")):
            number = float(value)
            if not math.isfinite(number):  # JSON has no NaN or Infinity
                return value
            return int(number) if number.is_integer() else number
        if kind in ("boolean", "bool", "binary"):
            return value.lower() == "true"
        container = kind in ("object", "array", "arr") or kind.startswith(("dict", "list"))
        if container:
            try:
                parsed = json.loads(value)
                # A JSON-encoded Python repr ("{'k': 'v'}") from a buggy chat template: one more read.
                return ast.literal_eval(parsed) if isinstance(parsed, str) else parsed
            except (ValueError, SyntaxError):
                pass
        parsed = ast.literal_eval(value)
        json.dumps(parsed)  # a set or bytes would not serialize: keep the text
        return parsed
    except (ValueError, SyntaxError, TypeError, OverflowError, MemoryError, RecursionError):
        return value


class Qwen3XmlToolParser(ToolParser):
    """Content is the text before the first call (<tool_call> holding a <function=, else a bare <function=);
    text between and after calls is dropped (vLLM's qwen3_coder). Parameters not in the tool's schema, and all
    parameters of unknown tools, stay strings; a call with a malformed function name is dropped (vLLM)."""
    names = ("qwen3_xml", "qwen3_coder")
    needs_special_tokens = True  # <tool_call> is a special token in Qwen vocabularies

    def parse(self, text: str, final: bool) -> ParsedTools:
        if not final:
            marks = [i for i in (text.find(TC), text.find(FN)) if i >= 0]
            cut = min(marks) if marks else len(text) - held_back(text, (TC, FN))
            return ParsedTools(text[:cut], tuple(self._calls(text, closed_only=True)))
        if FN not in text:
            return ParsedTools(text)
        calls = self._calls(text, closed_only=False)
        starts = [m.start() for m in re.finditer(re.escape(TC), text)]
        with_fn = [s for s in starts if FN in text[s:self._block_end(text, s)[0]]]
        return ParsedTools(text[:with_fn[0] if with_fn else text.find(FN)], tuple(calls))

    @staticmethod
    def _block_end(text: str, start: int) -> tuple[int, bool]:
        """End of the block opened at start (past its </tool_call>), and whether it is closed."""
        m = _CALL_END.search(text, start)
        if m:
            return m.end(), True
        nxt = text.find(TC, start + len(TC))
        return (nxt if nxt >= 0 else len(text)), False

    def _calls(self, text: str, closed_only: bool) -> list[ToolCall]:
        blocks, pos = [], text.find(TC)
        while pos >= 0:
            end, closed = self._block_end(text, pos)
            if not closed and closed_only:
                break
            blocks.append(text[pos + len(TC):end])
            pos = text.find(TC, end)
        if not blocks and not closed_only:  # no <tool_call> at all: a bare <function=...> (vLLM's fallback)
            blocks = [text]
        calls = [self._call(b) for b in blocks if FN in b]
        return [c for c in calls if c is not None]

    def _call(self, block: str) -> Optional[ToolCall]:
        body = block[block.index(FN) + len(FN):]
        gt = body.find(">")
        name = body[:gt]
        if gt < 0 or not name or _BAD_NAME & set(name):
            return None
        body = body[gt + 1:]
        end = body.rfind("</function>")
        body = body[:end] if end >= 0 else body
        props = self.parameters_of(name).get("properties") or {}
        args: dict[str, Any] = {}
        pos = 0
        while m := _PARAM_AT.search(body, pos):
            pname, start = m.group(1), m.end()
            close = _PARAM_END.search(body, start)
            stop, pos = (close.start(), close.end()) if close else (len(body), len(body))
            for later in _PARAM_AT.finditer(body, start, stop):  # a missing </parameter>: a new parameter closes it
                if later.group(1) not in args and later.group(1) != pname and (not props or later.group(1) in props):
                    stop = pos = later.start()
                    break
            value = body[start:stop]
            value = value[1:] if value.startswith("\n") else value  # the newlines around a value are layout
            value = value[:-1] if value.endswith("\n") else value
            args[pname] = convert(value, props[pname]) if pname in props else value
        return ToolCall(name, dump_arguments(args))
