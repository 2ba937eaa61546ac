"""StructuredOutputsParams: what a request's output must match (vLLM's class and field names).

Exactly one of json (a JSON schema, as a dict or a string), json_object (any JSON object), regex, choice (one of
these strings), grammar (EBNF/GBNF for xgrammar, Lark for guidance) or structural_tag (xgrammar's structural tag,
as a JSON string or dict) is set. The backend compiles it into a token mask applied before sampling.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Union

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
BACKENDS = ("auto", "xgrammar", "guidance")
# Free whitespace in JSON comes in runs of at most this many characters: enough for pretty-printing, and small
# models cannot loop on whitespace until max_tokens (gemma-3-270m did, with unbounded runs)
MAX_WHITESPACE = 24


@dataclass
class StructuredOutputsParams:
    """json / json_object / regex / choice / grammar / structural_tag: the constraint (one of them).
    disable_any_whitespace: JSON without free whitespace (compact output). disable_additional_properties: objects
    without additionalProperties take no other keys (guidance; xgrammar's strict mode does so always).
    disable_fallback: with the auto backend, fail instead of trying the other backend. whitespace_pattern: the
    regex JSON's free whitespace must match (guidance only; by default at most MAX_WHITESPACE characters)."""
    json: Optional[Union[str, dict]] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Optional[str] = None
    structural_tag: Optional[Union[str, dict]] = None
    # set by the server's reasoning parser: the grammar applies after this text ends the reasoning block
    _reasoning_end: Optional[str] = None

    def __post_init__(self) -> None:
        set_kinds = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(set_kinds) != 1:
            raise ValueError("structured_outputs needs exactly one of json, json_object, regex, choice, grammar, "
                             f"structural_tag; got {', '.join(set_kinds) or 'none'}")
        if self.whitespace_pattern is not None and (not isinstance(self.whitespace_pattern, str)
                                                    or self.kind not in ("json", "json_object")):
            raise ValueError("structured_outputs.whitespace_pattern must be a regex string, with json or json_object")
        for name in ("json_object", "disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool) and not (name == "json_object" and self.json_object is None):
                raise ValueError(f"structured_outputs.{name} must be true or false")
        if self.choice is not None and (not isinstance(self.choice, list) or not self.choice
                                        or not all(isinstance(c, str) for c in self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of strings")
        for name in ("json", "structural_tag"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    json.loads(value)
                except (json.JSONDecodeError, RecursionError) as e:
                    raise ValueError(f"structured_outputs.{name} is not valid JSON: {e}") from None
            elif value is not None and not isinstance(value, dict):
                raise ValueError(f"structured_outputs.{name} must be a JSON object or its text")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> tuple[Any, ...]:
        """What the compiled grammar depends on (the compile cache's key)."""
        value = getattr(self, self.kind)
        if isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)
        return (self.kind, value, self.disable_any_whitespace, self.disable_additional_properties,
                self.whitespace_pattern)

    def schema_text(self) -> str:
        """json / structural_tag as JSON text."""
        value = getattr(self, self.kind)
        return value if isinstance(value, str) else json.dumps(value)
