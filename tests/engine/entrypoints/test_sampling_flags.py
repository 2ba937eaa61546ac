"""The sampling flags of `ramlm generate` and `ramlm chat` come from SamplingParams: every field has a flag or a
stated reason not to, and every flag's value reaches SamplingParams (parse -> SamplingParams -> the value)."""
from __future__ import annotations

import pytest

from engine.entrypoints import sampling_args
from engine.entrypoints.cli import build_parser, main
from engine.sample.sampling import SamplingParams

# A value for every flag, unlike any command's default.
VALUES = {
    "max_tokens": 7, "min_tokens": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
    "repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 42,
    "stop": ["END", "\n\n"], "stop_token_ids": [1, 106], "ignore_eos": True, "include_stop_str_in_output": True,
    "skip_special_tokens": False, "spaces_between_special_tokens": False, "logit_bias": {5: -2.5, 9: 1.0},
}
COMMANDS = {"generate": ["generate", "a prompt"], "chat": ["chat"]}
COMMAND_DEFAULTS = {"generate": {"max_tokens": 128, "temperature": 0.0},
                    "chat": {"max_tokens": 512, "temperature": 0.7, "top_p": 0.95}}


def _argv(name: str, value) -> list[str]:
    flag = sampling_args.flag_of(name)
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in (flag, f"{k}={v}")]
    if isinstance(value, list):
        return [x for v in value for x in (flag, str(v))]
    return [flag, str(value)]


def test_every_field_has_a_flag_or_a_reason():
    fields = [f.name for f in sampling_args.sampling_fields()]
    flagged = set(sampling_args.flagged_fields())
    assert flagged | set(sampling_args.LEFT_OUT) == set(fields) and not flagged & set(sampling_args.LEFT_OUT)
    assert set(sampling_args.HELP) == flagged and all(sampling_args.HELP.values())
    assert all(reason.strip() for reason in sampling_args.LEFT_OUT.values())
    assert set(VALUES) == flagged  # a new flag needs a value here


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_reaches_sampling_params(command):
    defaults = {**{f.name: f.default for f in sampling_args.sampling_fields()}, **COMMAND_DEFAULTS[command]}
    argv = list(COMMANDS[command])
    for name, value in VALUES.items():
        assert value != defaults[name], name
        argv += _argv(name, value)
    params = sampling_args.sampling_params_from(build_parser().parse_args(argv))
    for name, value in VALUES.items():
        assert getattr(params, name) == value, name


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_defaults(command):
    params = sampling_args.sampling_params_from(build_parser().parse_args(COMMANDS[command]))
    expected = SamplingParams(**COMMAND_DEFAULTS[command])
    for f in sampling_args.sampling_fields():
        assert getattr(params, f.name) == getattr(expected, f.name), f.name


def test_one_flag_at_a_time_keeps_the_others_at_their_defaults():
    base = sampling_args.sampling_params_from(build_parser().parse_args(COMMANDS["generate"]))
    for name, value in VALUES.items():
        ns = build_parser().parse_args(COMMANDS["generate"] + _argv(name, value) + ["--temperature", "0.5"])
        params = sampling_args.sampling_params_from(ns)
        changed = {f.name for f in sampling_args.sampling_fields() if getattr(params, f.name) != getattr(base, f.name)}
        assert changed <= {name, "temperature"} and getattr(params, name) == value, name


def test_bad_values_fail_before_the_model_loads(capsys):
    assert main(["generate", "x", "--top-p", "0"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "x", "--logit-bias", "5:-1"])
    assert "expected TOKEN_ID=BIAS" in capsys.readouterr().err
