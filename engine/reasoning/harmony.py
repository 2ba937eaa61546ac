"""gpt-oss's harmony messages: the analysis channel is reasoning, the final channel (and preambles) content."""
from __future__ import annotations

from typing import Optional

from engine.reasoning.base import Reasoned, ReasoningParser
from engine.tokenization import harmony_format


class HarmonyReasoningParser(ReasoningParser):
    """Harmony output as detokenized with its special tokens, e.g.
    <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>

    Follows vLLM's parse_chat_output (entrypoints/openai/parser/harmony_utils.py, used by
    gptoss_reasoning_parser.py): the analysis messages joined by "\\n" are the reasoning; final messages and
    commentary without a recipient (preambles) joined by "\\n" are the content; commentary addressed to a tool
    (to=functions.x) is a tool call, neither. An unfinished message counts once it has a character of text, as
    in vLLM (an empty one would add a separator a stream could not take back).
    """
    names = ("openai", "openai_gptoss")
    needs_special_tokens = True

    def grammar_after(self) -> Optional[str]:
        return "<|channel|>final<|message|>"  # the answer's channel; analysis comes first, unconstrained

    def split(self, text: str, final: bool) -> Reasoned:
        reasoning: list[str] = []
        content: list[str] = []
        for m in harmony_format.messages(text, final):
            if not m.closed and not m.body:
                break  # an empty unfinished message would add a separator a stream could not take back
            if m.channel == "analysis":
                reasoning.append(m.body)  # vLLM keeps analysis addressed to a built-in tool here too
            elif m.is_content:
                content.append(m.body)
        return Reasoned("\n".join(reasoning) or None, "\n".join(content))
