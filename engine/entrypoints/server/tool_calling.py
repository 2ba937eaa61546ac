"""What a request's tools and tool_choice mean for its generation: the tools the chat template sees, the JSON
schema that forces "required" and named choices, and the parser that reads the output (vLLM's rules and
messages)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from engine.entrypoints.server.message_parsing import MessageParser
from engine.reasoning import get_reasoning_parser
from engine.structured.params import StructuredOutputsParams
from engine.tool_parsers import get_tool_parser
from engine.tool_parsers.forced import NamedCall, RequiredCalls, function_of, required_schema

AUTO_NEEDS_PARSER = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


@dataclass(frozen=True)
class ToolConfig:
    """The server's flags (vLLM's): --enable-auto-tool-choice, --tool-call-parser, --reasoning-parser,
    --exclude-tools-when-tool-choice-none."""
    enable_auto_tool_choice: bool = False
    tool_call_parser: Optional[str] = None
    reasoning_parser: Optional[str] = None
    exclude_tools_when_tool_choice_none: bool = False

    def __post_init__(self) -> None:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
        if self.tool_call_parser:
            get_tool_parser(self.tool_call_parser)  # ValueError listing the names
        if self.reasoning_parser:
            get_reasoning_parser(self.reasoning_parser)


@dataclass
class ToolPlan:
    choice: str  # none, auto, required or named
    template_tools: Optional[list[dict]]  # what the chat template receives
    structured: Optional[StructuredOutputsParams]  # the constraint forcing required and named choices
    parser: MessageParser

    def apply(self, params) -> None:
        """Into the request's SamplingParams: the forcing schema; the grammar starting after the reasoning (vLLM's
        rule with a reasoning parser); special tokens kept in the text for parsers whose markers are special."""
        if self.structured is not None:
            params.structured_outputs = self.structured
        so, reasoning = params.structured_outputs, self.parser.reasoning
        if so is not None and reasoning is not None:
            so._reasoning_end = reasoning.grammar_after()
        if self.parser.needs_special_tokens:
            params.skip_special_tokens = False


def plan(cfg: ToolConfig, tools: Optional[list[dict]], tool_choice: Union[str, dict, None], parallel: bool,
         template_kwargs: Optional[dict[str, Any]], constrained: bool, id_prefix: str = "call_",
         continuing: bool = False) -> ToolPlan:
    """Raises ValueError (a 400) for a choice that cannot be served.

    Args:
        tools: OpenAI function tools ({"type": "function", "function": {...}}) or None.
        tool_choice: "none", "auto", "required", {"type": "function", "function": {"name": ...}} or None (auto
            with tools, else none: OpenAI's default).
        parallel: parallel_tool_calls (false: at most one call).
        constrained: the request already has a response_format or structured_outputs constraint.
        continuing: the output continues the final assistant message (a prefill): it is answer, not reasoning.
    """
    reasoning = None
    if cfg.reasoning_parser and not continuing:
        reasoning = get_reasoning_parser(cfg.reasoning_parser)(template_kwargs)
    tools = tools or None
    choice = tool_choice if tool_choice is not None else ("auto" if tools else "none")
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if choice != "none" and not tools:
        raise ValueError("tool_choice: When using `tool_choice`, `tools` must be set.")
    if name is not None and name not in [function_of(t)["name"] for t in tools]:
        raise ValueError(f"tool_choice: Tool '{name}' has not been passed in `tools`.")
    if choice == "auto" and not cfg.enable_auto_tool_choice:
        raise ValueError(f"tool_choice: {AUTO_NEEDS_PARSER}")
    if constrained and (choice == "required" or name is not None):
        raise ValueError("tool_choice: a required or named tool choice forces the output's JSON itself; it cannot "
                         "be combined with response_format or structured_outputs")
    max_calls = None if parallel else 1
    if choice == "none":
        shown = None if cfg.exclude_tools_when_tool_choice_none else tools
        return ToolPlan("none", shown, None, MessageParser(reasoning, None, id_prefix))
    if choice == "auto":
        parser = get_tool_parser(cfg.tool_call_parser)(tools)
        return ToolPlan("auto", tools, None, MessageParser(reasoning, parser, id_prefix, max_calls))
    if choice == "required":
        so = StructuredOutputsParams(json=required_schema(tools, parallel))
        return ToolPlan("required", tools, so, MessageParser(reasoning, RequiredCalls(tools), id_prefix, max_calls))
    fn = next(function_of(t) for t in tools if function_of(t)["name"] == name)
    so = StructuredOutputsParams(json=fn.get("parameters") or {"type": "object", "properties": {}})
    return ToolPlan("named", tools, so, MessageParser(reasoning, NamedCall(tools, name), id_prefix))
