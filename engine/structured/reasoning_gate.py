"""Structured outputs after reasoning: while a completion is still inside its reasoning block, every token is
allowed; the grammar starts after the reasoning's end marker (vLLM's rule with a reasoning parser)."""
from __future__ import annotations

from typing import Callable


class AfterReasoning:
    """A matcher (engine/structured/backends.py's interface) that lets everything through until the text of the
    completion shows `end_marker`, then hands over to `inner`.

    Args:
        inner: the grammar's matcher.
        end_marker: the text that closes the reasoning block (e.g. "</think>").
        decode: token id -> its text, special tokens included.
    """

    def __init__(self, inner, end_marker: str, decode: Callable[[int], str]):
        self.inner, self.end_marker, self.decode = inner, end_marker, decode
        self.open = False
        self._tail = ""  # the last characters written, enough to find a marker split over tokens

    def fill(self, bitmask, row: int) -> None:
        if self.open:
            self.inner.fill(bitmask, row)
        else:
            bitmask[row] = -1  # every bit set: any token

    def accept(self, token: int) -> bool:
        if self.open:
            return self.inner.accept(token)
        self._tail = (self._tail + self.decode(token))[-(len(self.end_marker) + 64):]
        if self.end_marker in self._tail:
            self.open = True
        return True

    def is_terminated(self) -> bool:
        return self.open and self.inner.is_terminated()
