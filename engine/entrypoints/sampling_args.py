"""The sampling flags of `ramlm generate` and `ramlm chat`, generated from SamplingParams's fields (as
EngineArgs generates the engine flags): every field gets a flag with the help below, or is left out in
LEFT_OUT with the reason. A new SamplingParams field fails tests/engine/entrypoints/test_sampling_flags.py
until it is in one of the two."""
from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from engine.sample.sampling import SamplingParams

# field -> help text: the one description of each sampling flag.
HELP = {
    "max_tokens": "most tokens to generate",
    "min_tokens": "EOS and stop token ids are ignored until this many tokens were generated",
    "temperature": "sampling temperature; 0 = greedy",
    "top_p": "nucleus sampling: keep the smallest set of tokens whose probability reaches this, in (0, 1]",
    "top_k": "keep the k most likely tokens (0 or -1 = off)",
    "min_p": "drop tokens less likely than this fraction of the most likely one, in [0, 1]",
    "repetition_penalty": "divide the logits of tokens already seen (prompt or output) by this; 1 = off",
    "presence_penalty": "subtract this from the logits of tokens already generated, in [-2, 2]",
    "frequency_penalty": "subtract this per earlier occurrence from a generated token's logit, in [-2, 2]",
    "seed": "per-request random seed (reproducible sampling); --seed is the engine's",
    "stop": "stop string, not printed (repeatable)",
    "stop_token_ids": "token id that ends the output (repeatable)",
    "ignore_eos": "keep generating past end-of-sequence / end-of-turn (testing)",
    "include_stop_str_in_output": "print the stop string that ended the output",
    "skip_special_tokens": "leave special tokens out of the printed text",
    "spaces_between_special_tokens": "put spaces between special tokens in the printed text",
    "logit_bias": "BIAS added to token TOKEN_ID's logit before sampling (repeatable)",
}

# field -> why it has no flag.
LEFT_OUT = {
    "n": "the commands print one completion",
    "best_of": "the commands print one completion, so there is nothing to choose among",
    "logprobs": "the commands print text, not log-probabilities",
    "prompt_logprobs": "the commands print text, not log-probabilities",
    "detokenize": "the commands print text (and stop strings need it)",
    "output_kind": "the commands read the cumulative outputs themselves",
    "structured_outputs": "the commands print free text; the server and LLM take schemas and grammars",
}

# field -> flag name where the field's own would clash with an engine flag.
FLAG_NAMES = {"seed": "sampling-seed"}


def sampling_fields() -> list[dataclasses.Field]:
    """SamplingParams's arguments (fields set in __init__), in declaration order."""
    return [f for f in dataclasses.fields(SamplingParams) if f.init]


def flag_of(name: str) -> str:
    return "--" + FLAG_NAMES.get(name, name.replace("_", "-"))


def dest_of(name: str) -> str:
    return flag_of(name)[2:].replace("-", "_")


def _token_bias(text: str) -> tuple[int, float]:
    token, sep, bias = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID=BIAS, got {text!r}") from None


def _shape(hint) -> tuple[str, Any]:
    """('bool' | 'list' | 'dict' | 'scalar', the element or scalar type) of a field's annotation."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if hint is bool:
        return "bool", bool
    if typing.get_origin(hint) in (list, dict):
        return typing.get_origin(hint).__name__, typing.get_args(hint)[0]
    if args:  # Optional[...] or Union[None, str, list[str]]: the richest member decides
        shapes = [_shape(a) for a in args]
        return next((s for s in shapes if s[0] != "scalar"), shapes[0])
    return "scalar", hint


def add_sampling_args(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """Adds one flag per SamplingParams field that has one; `defaults` override SamplingParams's defaults."""
    hints = typing.get_type_hints(SamplingParams)
    for f in sampling_fields():
        if f.name in LEFT_OUT:
            continue
        kind, typ = _shape(hints[f.name])
        default = defaults.get(f.name, f.default)
        flag, help_ = flag_of(f.name), HELP[f.name]
        if kind == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_)
        elif kind == "dict":
            parser.add_argument(flag, action="append", type=_token_bias, default=None, metavar="TOKEN_ID=BIAS",
                                help=help_)
        elif kind == "list":
            parser.add_argument(flag, action="append", type=typ, default=None, help=help_)
        else:
            suffix = f" (default: {default})" if default is not None else ""
            parser.add_argument(flag, type=typ, default=default, help=help_ + suffix)


def sampling_params_from(ns: argparse.Namespace, **overrides: Any) -> SamplingParams:
    """SamplingParams from the parsed flags; `overrides` replace single values (e.g. a capped max_tokens)."""
    hints = typing.get_type_hints(SamplingParams)
    kwargs: dict[str, Any] = {}
    for f in sampling_fields():
        if f.name in LEFT_OUT:
            continue
        value = getattr(ns, dest_of(f.name))
        if value is not None and _shape(hints[f.name])[0] == "dict":
            value = dict(value)
        kwargs[f.name] = value
    kwargs.update(overrides)
    return SamplingParams(**kwargs)


def flagged_fields() -> list[str]:
    return [f.name for f in sampling_fields() if f.name not in LEFT_OUT]
