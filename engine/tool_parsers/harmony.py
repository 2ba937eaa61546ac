"""gpt-oss harmony tool calls: messages addressed to=functions.NAME; final-channel text and preambles are content."""
from __future__ import annotations

import json

from engine.tokenization import harmony_format
from engine.tool_parsers.base import ParsedTools, ToolCall, ToolParser, dump_arguments


def _arguments(body: str) -> str:
    try:
        return dump_arguments(json.loads(body))
    except ValueError:
        return body.strip()  # vLLM passes arguments that are not JSON on as written


class HarmonyToolParser(ToolParser):
    """Output detokenized with its special tokens, e.g. <|channel|>analysis<|message|>...<|end|><|start|>assistant
    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "SF"}<|call|>.

    As vLLM's openai tool parser: a message to functions.NAME is a call (on any channel; other recipients are
    built-in tools, dropped), and final-channel text and commentary without a recipient (preambles) are the
    content. Analysis text is left to the reasoning parser. Content messages are joined by "\\n" like the harmony
    reasoning parser, rather than vLLM's pick of one, so a stream never takes text back. Text with no harmony
    token at all reads as content.
    """
    names = ("openai",)
    needs_special_tokens = True
    reads_whole_output = True  # the calls are messages of their own, beside the analysis channel

    def parse(self, text: str, final: bool) -> ParsedTools:
        if final and "<|" not in text:
            return ParsedTools(text)
        content: list[str] = []
        calls: list[ToolCall] = []
        for m in harmony_format.messages(text, final):
            if m.recipient is not None:
                # a call counts once closed, or at the end of a final parse (<|call|> may be missing)
                if m.recipient.startswith("functions.") and (m.closed or final):
                    calls.append(ToolCall(m.recipient[len("functions."):], _arguments(m.body)))
            elif m.is_content and (m.closed or m.body):  # an empty unfinished message would add a separator early
                content.append(m.body)
        return ParsedTools("\n".join(content), tuple(calls))
