"""What every reasoning parser is: text the model wrote -> (reasoning, content), for a finished output and a
growing one (streaming).

The streaming contract (the server relies on it): for an output t and any prefix p of t,
split(p, final=False) gives a reasoning that is a prefix of split(t, final=True)'s reasoning and a content that
is a prefix of its content. So a partial split holds back trailing text that could still become a marker.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional


@dataclass(frozen=True)
class Reasoned:
    reasoning: Optional[str]  # None when the output has no reasoning part
    content: str


class ReasoningParser:
    """A model family's way of writing its reasoning.

    names: the --reasoning-parser names it answers to (vLLM's).
    needs_special_tokens: its markers are special tokens (detokenize with skip_special_tokens=False).

    Args:
        template_kwargs: the request's chat_template_kwargs (enable_thinking, thinking, ...): whether the prompt
            opened a reasoning block decides how an output without markers reads.
    """
    names: ClassVar[tuple[str, ...]] = ()
    needs_special_tokens: ClassVar[bool] = False

    def __init__(self, template_kwargs: Optional[dict[str, Any]] = None):
        self.template_kwargs = dict(template_kwargs or {})

    def split(self, text: str, final: bool) -> Reasoned:
        raise NotImplementedError

    def grammar_after(self) -> Optional[str]:
        """The text that ends the reasoning, where a structured-output grammar starts (vLLM constrains the answer,
        not the reasoning); None: the output has no reasoning block and the grammar starts at once."""
        return None
