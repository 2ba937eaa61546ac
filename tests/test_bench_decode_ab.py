"""bench.decode_ab: two models in one process, round by round, medians and ratios against the first."""
from __future__ import annotations

import re

import pytest

from bench import decode_ab
from tests.model.tiny_models import saved_tiny


def test_two_models_alternate_and_report_ratios(tmp_path, capsys):
    folders = []
    for arch in ("llama", "qwen3"):
        folder = tmp_path / arch
        saved_tiny(folder, arch)
        (folder / "tokenizer_config.json").write_text('{"bos_token": "t2", "eos_token": "t1", "unk_token": "t0"}')
        folders.append(str(folder))
    decode_ab.main(["--model", folders[0], "--model", folders[1], "--rounds", "3", "--gen-tokens", "3", "--no-json"])
    out = capsys.readouterr().out
    rounds = re.findall(r"^round (\d): ([\d.]+), ([\d.]+) tok/s", out, re.M)
    assert [r[0] for r in rounds] == ["0", "1", "2"] and all(float(v) > 0 for r in rounds for v in r[1:])
    assert [line.endswith("(not counted)") for line in out.splitlines() if line.startswith("round")] == [True, False, False]
    first = re.search(re.escape(folders[0]) + r": [\d.]+ tok/s \(([\d.]+)x the first; median of rounds' ratios "
                      r"([\d.]+)x\)", out)
    assert first and first.groups() == ("1.000", "1.000")
    assert re.search(re.escape(folders[1]) + r": [\d.]+ tok/s \([\d.]+x the first", out)


def test_one_model_is_refused():
    with pytest.raises(SystemExit):
        decode_ab.main(["--model", "x", "--no-json"])
