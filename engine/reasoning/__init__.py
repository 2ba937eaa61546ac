"""Reasoning parsers by their --reasoning-parser names (vLLM's): the model's text -> reasoning + content."""
from __future__ import annotations

from engine.reasoning.base import Reasoned, ReasoningParser
from engine.reasoning.harmony import HarmonyReasoningParser
from engine.reasoning.think_tags import (DeepSeekR1ReasoningParser, DeepSeekV3ReasoningParser,
                                         Gemma4ReasoningParser, Glm45ReasoningParser, Qwen3ReasoningParser)

__all__ = ["Reasoned", "ReasoningParser", "REASONING_PARSERS", "get_reasoning_parser"]

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    name: cls
    for cls in (Qwen3ReasoningParser, DeepSeekR1ReasoningParser, DeepSeekV3ReasoningParser, Glm45ReasoningParser,
                Gemma4ReasoningParser, HarmonyReasoningParser)
    for name in cls.names
}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The parser class registered under name; ValueError naming it and the valid names otherwise."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        valid = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning parser {name!r}; valid names: {valid}") from None
