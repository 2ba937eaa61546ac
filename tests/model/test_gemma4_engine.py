"""The engine over Gemma 4's caches (tiny gemma4: sliding layers of window 5 and full layers with their own head_dim,
two KV-shared layers reading their sources' blocks, per-layer embeddings): batched, chunked at odd chunk sizes, with
prefix-cache hits and preemption, each request's answer equals its solo run (tests/model/engine_vs_solo.py). The MoE
model (a dense MLP beside the experts) once through the same runs."""
from __future__ import annotations

import pytest

from tests.model import engine_vs_solo as ev


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return ev.tiny_folder(tmp_path_factory.mktemp("gemma4_engine"), "gemma4")


@pytest.fixture(scope="module")
def solo_invariant(folder):
    llm = ev.solo_invariant_llm(folder)
    caches = llm.llm_engine.runner.kv_caches
    assert caches[4] is caches[2] and caches[5] is caches[3]  # the KV-shared layers hold their sources' blocks
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


def test_moe_model_runs_equal_each_solo_run(tmp_path):
    """gemma4-moe (dense MLP + MoE in parallel) batched in chunks of 7 with prefix-cache hits, then preempted from a
    tiny pool: token for token its solo runs under batch_invariant."""
    folder = ev.tiny_folder(tmp_path, "gemma4-moe")
    solo = ev.ids(ev.one_by_one(ev.solo_invariant_llm(folder), ev.LONGER))
    for budget, blocks in ((7, None), (2048, ev.TINY_POOL)):
        ev.check_batch_invariant(folder, solo, budget, True, blocks)
