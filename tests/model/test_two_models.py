"""Two models in one process, stepping at the same time from two threads with different prefill precisions, each
give exactly what they give alone: nothing about a step (the row grouping) lives in module state."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.model.loader import load_model
from engine.worker.runner import ModelRunner, SeqChunk
from tests.model.tiny_models import tiny_model

PROMPTS = [list(range(3, 43)), [5, 17, 99, 3]]  # a long chunk (the dense path) beside a short one


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("two")
    tiny_model("qwen3").save_pretrained(path, safe_serialization=True)
    return str(path)


def _run(folder, dense_dtype, rounds=6):
    model, _ = load_model(folder)
    model.prefill_dtype = dense_dtype
    out = []
    for _ in range(rounds):
        runner = ModelRunner(model, num_blocks=12, block_size=16, kv_cache_dtype="fp32")
        out.append(runner.execute([SeqChunk(tuple(p), 0, (1 + 2 * s, 2 + 2 * s, 9 + s), "all")
                                   for s, p in enumerate(PROMPTS)]))
    return out


def test_two_models_step_together_as_they_do_alone(folder):
    alone = {d: _run(folder, d, rounds=1)[0] for d in ("float32", "bfloat16")}
    together, errors = {}, []

    def worker(d):
        try:
            together[d] = _run(folder, d)
        except Exception as e:  # surfaced below
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(d,)) for d in ("float32", "bfloat16")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for d in ("float32", "bfloat16"):
        for rnd in together[d]:
            for got, want in zip(rnd, alone[d]):
                np.testing.assert_array_equal(got, want)
