"""Every RAMLM_* variable the code reads is declared in cpu_kernels/envs.py, and the README's table is that list."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cpu_kernels import envs

ROOT = Path(__file__).resolve().parents[2]


def test_every_variable_in_the_code_is_declared():
    used = set()
    for pkg in ("cpu_kernels", "gpu_kernels", "engine", "offload", "bench"):
        for path in (ROOT / pkg).rglob("*.py"):
            used |= set(re.findall(r"RAMLM_[A-Z0-9_]+", path.read_text()))
    assert used <= set(envs.VARIABLES), sorted(used - set(envs.VARIABLES))


def test_the_readme_table_is_the_declared_list():
    assert envs.markdown_table() in (ROOT / "README.md").read_text()


def test_values_parse_and_bad_ones_name_the_variable(monkeypatch):
    monkeypatch.setenv("RAMLM_FUSED_BLOCKS", "0")
    assert envs.get("RAMLM_FUSED_BLOCKS") is False
    monkeypatch.delenv("RAMLM_FUSED_BLOCKS")
    assert envs.get("RAMLM_FUSED_BLOCKS") is True
    monkeypatch.setenv("RAMLM_SDPA_PREFILL", "1")
    assert envs.get("RAMLM_SDPA_PREFILL") is True
    monkeypatch.setenv("RAMLM_SERIAL_WORK", "lots")
    with pytest.raises(ValueError, match="RAMLM_SERIAL_WORK"):
        envs.get("RAMLM_SERIAL_WORK")
