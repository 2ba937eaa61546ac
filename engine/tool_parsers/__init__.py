"""Tool-call parsers by their --tool-call-parser names (vLLM's)."""
from __future__ import annotations

from engine.tool_parsers.base import ParsedTools, ToolCall, ToolParser
from engine.tool_parsers.gemma4 import Gemma4ToolParser
from engine.tool_parsers.harmony import HarmonyToolParser
from engine.tool_parsers.hermes import HermesToolParser
from engine.tool_parsers.llama3_json import Llama3JsonToolParser
from engine.tool_parsers.mistral import MistralToolParser
from engine.tool_parsers.pythonic import PythonicToolParser
from engine.tool_parsers.qwen3_xml import Qwen3XmlToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    name: cls
    for cls in (HermesToolParser, Llama3JsonToolParser, MistralToolParser, Qwen3XmlToolParser, PythonicToolParser,
                HarmonyToolParser, Gemma4ToolParser)
    for name in cls.names
}


def get_tool_parser(name: str) -> type[ToolParser]:
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        # vLLM's message (there a KeyError)
        raise ValueError(f"invalid tool call parser: {name} (chose from {{ {','.join(sorted(TOOL_PARSERS))} }})") \
            from None


__all__ = ["TOOL_PARSERS", "ParsedTools", "ToolCall", "ToolParser", "get_tool_parser"]
