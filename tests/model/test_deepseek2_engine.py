"""The engine over the latent cache (tiny DeepSeek-V3, MLA): batched, chunked at odd chunk sizes, with prefix-cache
hits and preemption, each request's answer equals its solo run (tests/model/engine_vs_solo.py)."""
from __future__ import annotations

import pytest

from tests.model import engine_vs_solo as ev


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return ev.tiny_folder(tmp_path_factory.mktemp("deepseek_engine"), "deepseek2")


@pytest.fixture(scope="module")
def solo_invariant(folder):
    llm = ev.solo_invariant_llm(folder)
    assert llm.llm_engine.runner.kv_caches[0][0] is llm.llm_engine.runner.kv_caches[0][1]  # the latent cache
    return ev.ids(ev.one_by_one(llm, ev.LONGER))


@pytest.mark.parametrize("budget,caching,blocks", ev.INVARIANT_CASES)
def test_batch_invariant_runs_equal_each_solo_run(folder, solo_invariant, budget, caching, blocks):
    ev.check_batch_invariant(folder, solo_invariant, budget, caching, blocks)


@pytest.fixture(scope="module")
def solo_default(folder):
    return ev.solo_default(folder)


@pytest.mark.parametrize("budget,blocks", ev.DEFAULT_CASES)
def test_default_mode_equals_solo_up_to_near_ties(folder, solo_default, budget, blocks):
    ev.check_default(folder, solo_default, budget, blocks)
