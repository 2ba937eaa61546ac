"""Reasoning in a tag pair (<think>...</think> and Gemma 4's <|channel>...<channel|>), one class per model family."""
from __future__ import annotations

import re
from typing import ClassVar, Optional

from engine.reasoning.base import Reasoned, ReasoningParser
from engine.tool_parsers.base import held_back


class ThinkTagsParser(ReasoningParser):
    """Reasoning up to the end tag, the answer after it (vLLM's BaseThinkingReasoningParser, basic_parsers.py).

    The opening tag is optional (templates that open the block in the prompt leave only the end tag in the
    output); when present at the start of the output it is dropped with the whitespace before it, as vLLM's
    partition does. An opening tag later in the text is literal text: vLLM drops everything before it, which a
    stream that already sent that text cannot undo (vLLM's own streaming keeps it too).
    Content keeps what follows the end tag verbatim (Qwen3's "\\n\\n" included), as vLLM does.
    """
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    label: ClassVar[str] = ""  # a role label the model writes first in its reasoning (Gemma 4: "thought\n")
    tags_required: ClassVar[bool] = False  # an output that does not open with the start tag is all content
    tool_call_ends: ClassVar[bool] = False  # a genuine <tool_call><function=...> also ends the reasoning

    def thinking(self) -> bool:
        """Whether the prompt left the model in a reasoning block (False: the whole output is content)."""
        return True

    def grammar_after(self) -> Optional[str]:
        return self.end if self.thinking() else None

    def split(self, text: str, final: bool) -> Reasoned:
        if not self.thinking():
            # vLLM's IdentityReasoningParser: even a stray end tag stays in the content.
            return Reasoned(None, text)
        head = text.lstrip()
        if head.startswith(self.start):
            body = head[len(self.start):]
        elif not final and self.start.startswith(head):
            return Reasoned(None, "")  # whitespace or a partial start tag: which side is not known yet
        elif self.tags_required:
            return Reasoned(None, text)
        else:
            body = text
        cut, rest = self._end(body)
        if cut >= 0:
            return Reasoned(self._unlabel(body[:cut], True) or None, body[rest:])
        if not final:
            body = body[:self._held_from(body)]
        # No end tag: the output stopped while thinking (truncated), so all of it is reasoning.
        return Reasoned(self._unlabel(body, final) or None, "")

    def _end(self, body: str) -> tuple[int, int]:
        """(where the reasoning stops, where the content starts); (-1, -1) while it has not ended."""
        found = body.find(self.end)
        stop = found if found >= 0 else len(body)
        if self.tool_call_ends:
            call = _genuine_tool_call(body, stop)
            if call >= 0:
                return call, call  # the call opens the content, for the tool parser
        return (found, found + len(self.end)) if found >= 0 else (-1, -1)

    def _held_from(self, body: str) -> int:
        """Where the text that could still become an end marker begins."""
        held = len(body) - held_back(body, (self.end, _TOOL_CALL) if self.tool_call_ends else (self.end,))
        if self.tool_call_ends:
            at = body.rfind(_TOOL_CALL)
            if at >= 0 and _FUNCTION.startswith(body[at + len(_TOOL_CALL):].lstrip()):
                held = min(held, at)  # "<tool_call>\n<func": a call may be starting
        return held

    def _unlabel(self, reasoning: str, known: bool) -> str:
        if self.label and reasoning.startswith(self.label):
            return reasoning[len(self.label):]
        if self.label and not known and self.label.startswith(reasoning):
            return ""  # "thou": may still be the label
        return reasoning


_TOOL_CALL = "<tool_call>"
_FUNCTION = "<function"  # vLLM's lookahead: <tool_call> then (whitespace) <function= or <function name=...
_GENUINE_CALL = re.compile(r"<tool_call>\s*<function[\s=]")


def _genuine_tool_call(body: str, before: int) -> int:
    """Index of the first <tool_call> that opens a real call, if it comes before `before`; else -1."""
    m = _GENUINE_CALL.search(body)
    return m.start() if m and m.start() < before else -1


class DeepSeekR1ReasoningParser(ThinkTagsParser):
    """DeepSeek-R1: the template opens <think> in the prompt (vLLM deepseek_r1_reasoning_parser.py)."""
    names = ("deepseek_r1",)


class Qwen3ReasoningParser(ThinkTagsParser):
    """Qwen3 / Qwen3-2507 / Qwen3.5 (vLLM qwen3_reasoning_parser.py).

    Thinking unless enable_thinking is False; then the template closes an empty block in the prompt and the
    output is content, a stray </think> included (vLLM's streaming skips the parser then; its final parse would
    split there). A <tool_call> followed by <function...> before any </think> ends the reasoning (Qwen3.5
    calls tools without closing its thoughts). vLLM's final parse prefers a </think> anywhere in the text over
    that call; here the first marker wins, as in vLLM's streaming, so a stream never takes back what it sent.
    """
    names = ("qwen3",)
    tool_call_ends = True

    def thinking(self) -> bool:
        return bool(self.template_kwargs.get("enable_thinking", True))


class DeepSeekV3ReasoningParser(ThinkTagsParser):
    """DeepSeek-V3.1+: reasoning only when the request asks for it (thinking or enable_thinking), else identity
    (vLLM deepseek_v3_reasoning_parser.py)."""
    names = ("deepseek_v3",)

    def thinking(self) -> bool:
        kw = self.template_kwargs
        return bool(kw.get("thinking")) or bool(kw.get("enable_thinking"))


class Glm45ReasoningParser(DeepSeekV3ReasoningParser):
    """GLM-4.5/4.6: vLLM registers glm45 as DeepSeekV3ReasoningWithThinkingParser, thinking unless the request
    sets thinking or enable_thinking (to False)."""
    names = ("glm45",)

    def thinking(self) -> bool:
        kw = self.template_kwargs
        if kw.get("thinking") is None and kw.get("enable_thinking") is None:
            return True
        return super().thinking()


class Gemma4ReasoningParser(ThinkTagsParser):
    """Gemma 4: <|channel>thought\\n...<channel|>answer; the "thought\\n" label is not reasoning, and an output
    without the channel tags is all content (vLLM gemma4_reasoning_parser.py). vLLM also reads a bare
    <channel|> in untagged text as an end of reasoning; its streaming does not, nor does this."""
    names = ("gemma4",)
    needs_special_tokens = True  # vLLM's adjust_request sets skip_special_tokens=False
    start = "<|channel>"
    end = "<channel|>"
    label = "thought\n"
    tags_required = True

    def grammar_after(self) -> Optional[str]:
        # the model may answer without a thought block: the grammar waits only when thinking was asked for
        return self.end if self.template_kwargs.get("enable_thinking") else None
