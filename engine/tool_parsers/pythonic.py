"""Pythonic tool calls (Llama 3.2 / 4): the whole output is [f(a=1), g(b="x")], maybe in <|python_start|>."""
from __future__ import annotations

import ast
from typing import Optional

from engine.tool_parsers.base import ParsedTools, ToolCall, ToolParser, dump_arguments

START, END = "<|python_start|>", "<|python_end|>"


def _call(node: ast.AST) -> ToolCall:
    """One call of literal keyword arguments; ValueError otherwise. Positional arguments are ignored, as in
    vLLM; values go through literal_eval, so -1 and tuples read too (vLLM rejects them)."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError("not a function call")
    args = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError("**kwargs")
        args[kw.arg] = ast.literal_eval(kw.value)
    try:
        return ToolCall(node.func.id, dump_arguments(args))
    except TypeError as e:  # a set or bytes has no JSON form
        raise ValueError(str(e)) from e


def _items(body: str) -> tuple[list[str], bool]:
    """The top-level items of the list body opens (body[0] == "["), and whether its "]" was reached."""
    items, depth, quote, start, i = [], 0, "", 1, 0
    while i < len(body):
        c = body[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                items.append(body[start:i])
                return items, True
        elif c == "," and depth == 1:
            items.append(body[start:i])
            start = i + 1
        i += 1
    return items, False


class PythonicToolParser(ToolParser):
    """Calls only when the whole output is one list of calls (vLLM); otherwise it is all content."""
    names = ("pythonic", "llama4_pythonic")

    def parse(self, text: str, final: bool) -> ParsedTools:
        body = text.strip()
        if body.startswith(START):
            body = body[len(START):].replace(END, "").strip()
        elif not final and START.startswith(body):  # blank so far, or a partial <|python_start|>
            return ParsedTools("")
        if not body.startswith("["):
            if not final and not body and text.strip():  # just <|python_start|> so far
                return ParsedTools("")
            return ParsedTools(text)
        if final:
            calls = self._whole(body)
            return ParsedTools(text) if calls is None else ParsedTools("", tuple(calls))
        calls = []
        items, _ = _items(body)
        for item in items:  # each item is closed by a "," or the "]"
            try:
                calls.append(_call(ast.parse(item.strip(), mode="eval").body))
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                break  # the final parse will give the text back as content
        return ParsedTools("", tuple(calls))

    @staticmethod
    def _whole(body: str) -> Optional[list[ToolCall]]:
        try:
            tree = ast.parse(body, mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                return None
            return [_call(e) for e in tree.elts]
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
