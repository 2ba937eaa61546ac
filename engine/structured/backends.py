"""The two grammar backends, real libraries both: xgrammar and llguidance ('guidance', vLLM's name). Each turns a
StructuredOutputsParams into a compiled grammar (the slow, cached step) and hands out matchers that fill one row of a
token bitmask (int32 words, bit t of the row = token t allowed) and accept the sampled tokens.

Each backend checks a request cheaply first (check: syntax and supported features, ValueError naming the problem),
so that a bad request is refused before it is queued; compile does the tokenizer-dependent work.
"""
from __future__ import annotations

import copy
import json
import re
from typing import Any

from engine.structured.params import MAX_WHITESPACE, StructuredOutputsParams

OBJECT_SCHEMA = '{"type": "object"}'  # json_object: OpenAI's "any JSON object"
# JSON schema keywords xgrammar's converter passes over without enforcing them (vLLM sends such schemas to guidance)
XGRAMMAR_IGNORES = ("multipleOf", "uniqueItems", "contains", "minContains", "maxContains", "format", "not", "if",
                    "then", "else", "dependentRequired", "dependentSchemas", "patternProperties", "propertyNames",
                    "minProperties", "maxProperties", "unevaluatedProperties", "unevaluatedItems")


def _ebnf_literal(s: str) -> str:
    return '"' + re.sub(r'(["\\])', r"\\\1", s).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + '"'


def choice_grammar(choices: list[str], root: str) -> str:
    """An EBNF (root '::=') or Lark (root ':') grammar whose language is exactly the choices."""
    return f"{root} {'::=' if root == 'root' else ':'} " + " | ".join(_ebnf_literal(c) for c in choices)


def is_lark(grammar: str) -> bool:
    """EBNF/GBNF rules are written 'name ::= ...'; without one the grammar is Lark (vLLM's rule of thumb)."""
    return "::=" not in grammar


def _unenforced(schema: Any) -> list[str]:
    """The XGRAMMAR_IGNORES keywords a schema uses as keywords (not as property names)."""
    found: set[str] = set()

    def walk(node: Any, in_properties: bool = False) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if not in_properties and k in XGRAMMAR_IGNORES:
                    found.add(k)
                walk(v, in_properties=k in ("properties", "$defs", "definitions") and not in_properties)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(schema)
    return sorted(found)


def _no_additional_properties(schema: Any) -> Any:
    """A copy of a JSON schema whose objects without additionalProperties take no other keys."""
    if isinstance(schema, dict):
        out = {k: _no_additional_properties(v) for k, v in schema.items()}
        if out.get("type") == "object" and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_no_additional_properties(v) for v in schema]
    return copy.deepcopy(schema)


class XgrammarBackend:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int):
        import xgrammar as xgr
        self.xgr = xgr
        backend = tokenizer.backend
        # as xgrammar's TokenizerInfo.from_huggingface reads a fast tokenizer: the vocabulary by id, the vocab type
        # and prefix-space rule from the serialized tokenizer; the model's vocab_size is the mask's width
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
        encoded = [""] * vocab_size
        for token, i in backend.get_vocab(with_added_tokens=True).items():
            if i < vocab_size:
                encoded[i] = token
        info = xgr.TokenizerInfo(encoded, vocab_type=meta["vocab_type"], vocab_size=vocab_size,
                                 stop_token_ids=list(tokenizer.eos_token_ids), add_prefix_space=meta["add_prefix_space"])
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)

    def check(self, p: StructuredOutputsParams) -> None:
        """Builds the grammar without the tokenizer: raises ValueError for what xgrammar cannot parse or take,
        and for schema keywords it would not enforce."""
        if p.whitespace_pattern is not None:
            raise ValueError("structured_outputs.whitespace_pattern (xgrammar): not supported (the guidance backend "
                             "takes it)")
        if p.kind == "json":
            ignored = _unenforced(json.loads(p.schema_text()))
            if ignored:
                raise ValueError(f"structured_outputs.json (xgrammar): the schema uses {', '.join(ignored)}, which "
                                 "xgrammar does not enforce (the guidance backend may)")
        try:
            self._grammar(p)
        except Exception as e:  # the libraries raise several types for a bad constraint: all are the request's
            raise ValueError(f"structured_outputs.{p.kind} (xgrammar): {_first_line(e)}") from None

    def _grammar(self, p: StructuredOutputsParams):
        G = self.xgr.Grammar
        kind = p.kind
        if kind in ("json", "json_object"):
            return G.from_json_schema(OBJECT_SCHEMA if kind == "json_object" else p.schema_text(),
                                      any_whitespace=not p.disable_any_whitespace, strict_mode=True,
                                      max_whitespace_cnt=None if p.disable_any_whitespace else MAX_WHITESPACE)
        if kind == "regex":
            return G.from_regex(p.regex)
        if kind == "choice":
            return G.from_ebnf(choice_grammar(p.choice, "root"))
        if kind == "grammar":
            return G.from_lark(p.grammar) if is_lark(p.grammar) else G.from_ebnf(p.grammar)
        tag = json.loads(p.schema_text())
        if "structures" in tag:  # vLLM's form: structures of begin / schema / end, and the triggers
            items = [self.xgr.StructuralTagItem(begin=st["begin"], schema=json.dumps(st.get("schema", {})),
                                                end=st["end"]) for st in tag["structures"]]
            return G.from_structural_tag(items, tag.get("triggers", []))
        return G.from_structural_tag(p.schema_text())  # xgrammar's own StructuralTag JSON

    def compile(self, p: StructuredOutputsParams):
        try:
            return self.compiler.compile_grammar(self._grammar(p))
        except Exception as e:  # the libraries raise several types for a bad constraint: all are the request's
            raise ValueError(f"structured_outputs.{p.kind} (xgrammar): {_first_line(e)}") from None

    def matcher(self, compiled) -> "XgrammarMatcher":
        return XgrammarMatcher(self.xgr.GrammarMatcher(compiled))


class XgrammarMatcher:
    def __init__(self, m):
        self.m = m

    def fill(self, bitmask, row: int) -> None:
        """Row `row` of bitmask; left all zero (nothing allowed) once the grammar has ended."""
        if not self.m.is_terminated():
            self.m.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        return bool(self.m.accept_token(int(token)))

    def is_terminated(self) -> bool:
        return bool(self.m.is_terminated())


class GuidanceBackend:
    name = "guidance"

    def __init__(self, tokenizer, vocab_size: int):
        import llguidance
        import llguidance.numpy  # noqa: F401  (fill_next_token_bitmask)
        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size,
                                                eos_token=list(tokenizer.eos_token_ids))

    def _grammar(self, p: StructuredOutputsParams) -> str:
        llg, kind = self.llg, p.kind
        if kind in ("json", "json_object"):
            schema = json.loads(OBJECT_SCHEMA if kind == "json_object" else p.schema_text())
            if p.disable_additional_properties:
                schema = _no_additional_properties(schema)
            defaults = {"whitespace_flexible": not p.disable_any_whitespace}
            if p.whitespace_pattern is not None or not p.disable_any_whitespace:
                defaults["whitespace_pattern"] = (p.whitespace_pattern if p.whitespace_pattern is not None
                                                  else f"[\\x20\\x0A\\x0D\\x09]{{0,{MAX_WHITESPACE}}}")
            return llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=defaults)
        if kind == "regex":
            return llg.grammar_from("regex", p.regex)
        if kind == "choice":
            return llg.grammar_from("lark", choice_grammar(p.choice, "start"))
        if kind == "grammar":
            return llg.grammar_from("lark" if is_lark(p.grammar) else "gbnf", p.grammar)
        raise ValueError("structured_outputs.structural_tag is an xgrammar feature: use the xgrammar backend")

    def check(self, p: StructuredOutputsParams) -> None:
        try:
            grammar = self._grammar(p)
        except Exception as e:  # the libraries raise several types for a bad constraint: all are the request's
            raise ValueError(f"structured_outputs.{p.kind} (guidance): {_first_line(e)}") from None
        err = self.llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if err:
            raise ValueError(f"structured_outputs.{p.kind} (guidance): {_first_line(err)}")

    def compile(self, p: StructuredOutputsParams) -> str:
        self.check(p)  # guidance compiles lazily in its matcher: the checked grammar is what is kept
        return self._grammar(p)

    def matcher(self, compiled: str) -> "GuidanceMatcher":
        return GuidanceMatcher(self.llg, self.llg.LLMatcher(self.tokenizer, compiled))


class GuidanceMatcher:
    def __init__(self, llg, m):
        self.llg, self.m = llg, m

    def fill(self, bitmask, row: int) -> None:
        if not self.m.is_stopped():
            self.llg.numpy.fill_next_token_bitmask(self.m, bitmask, row)

    def accept(self, token: int) -> bool:
        return bool(self.m.consume_token(int(token))) and not self.m.is_error()

    def is_terminated(self) -> bool:
        return bool(self.m.is_stopped())


def _first_line(e: Any) -> str:
    """A library's message without its log prefix ('[time] file.cc:line: ') and traceback lines."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return re.sub(r"^\[[0-9:]+\] \S+:\d+: ", "", text)
