"""gpt-oss's harmony output as messages: <|channel|>NAME [to=RECIPIENT] ...<|message|>BODY, closed by <|end|>,
the stop tokens <|return|>/<|call|> (often not in the text) or the next <|start|>."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from engine.tool_parsers.base import held_back

_MESSAGE = "<|message|>"
_CLOSE = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_CLOSE_RE = re.compile("|".join(re.escape(t) for t in _CLOSE))
_CHANNEL_RE = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT_RE = re.compile(r"\bto=([^\s<]+)")  # in the role part or after the channel


@dataclass(frozen=True)
class HarmonyMessage:
    channel: Optional[str]
    recipient: Optional[str]  # functions.NAME for a tool call
    body: str
    closed: bool

    @property
    def is_content(self) -> bool:
        """The answer's text: the final channel, and commentary to nobody (a preamble before tool calls)."""
        return self.recipient is None and self.channel in ("final", "commentary")


def messages(text: str, final: bool) -> list[HarmonyMessage]:
    """The messages of an output, in order; the last may be unclosed (a partial parse holds back a trailing piece
    of a closing token from its body). A header still being written is not a message yet."""
    out, pos = [], 0
    while True:
        opened = text.find(_MESSAGE, pos)
        if opened < 0:
            return out
        header, start = text[pos:opened], opened + len(_MESSAGE)
        closed = _CLOSE_RE.search(text, start)
        if closed:
            body = text[start:closed.start()]
            pos = closed.start() if closed.group() == "<|start|>" else closed.end()  # <|start|> opens the next
        else:
            body = text[start:]
            if not final:
                body = body[:len(body) - held_back(body, _CLOSE)]
        channel, recipient = _CHANNEL_RE.search(header), _RECIPIENT_RE.search(header)
        out.append(HarmonyMessage(channel.group(1) if channel else None, recipient.group(1) if recipient else None,
                                  body, closed is not None))
        if not closed:
            return out
