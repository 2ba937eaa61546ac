"""AsyncLLMEngine over a real LLMEngine (the default model): a request that fails inside a step fails
alone, a refused request holds nothing, and a large n fans out as the scheduler has room and stops at
an abort."""
from __future__ import annotations

import asyncio
import logging

import pytest

from engine.args import EngineArgs
from engine.async_engine import AsyncLLMEngine, EngineStepError
from engine.engine import LLMEngine
from engine.sample.sampling import SamplingParams

MAX_NUM_SEQS = 8


@pytest.fixture(scope="module")
def engine():
    eng = AsyncLLMEngine.build(lambda: LLMEngine(EngineArgs(max_model_len=256, kv_cache_memory=0.25,
                                                             max_num_seqs=MAX_NUM_SEQS)))
    yield eng
    eng.shutdown()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def _state(e: LLMEngine) -> dict:
    kv = e.kv_manager
    return {"parents": len(e.parents), "children": len(e.children), "scheduled": len(e.scheduler.requests),
            "used_blocks": kv.num_usable_blocks - kv.num_free_blocks,
            "live_children": sum(c.request is not None for c in e.children.values())}  # the rest keep outputs only


IDLE = {"parents": 0, "children": 0, "scheduled": 0, "used_blocks": 0, "live_children": 0}


async def _drain(stream) -> list:
    return [out async for out in stream]


def test_a_request_failing_inside_a_step_fails_alone(engine, caplog):
    caplog.set_level(logging.ERROR, logger="ramlm.async_engine")
    async def main():
        streams = {rid: await engine.add_request(rid, f"Story {rid}: once upon a time",
                                                 SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0))
                   for rid in ("ok-1", "bad", "ok-2")}

        def corrupt(e: LLMEngine) -> None:  # a state add_request refuses: a logit_bias token outside the vocabulary
            e.children["bad"].params.logit_bias = {e.config.vocab_size + 5: 1.0}
        await engine.run_on_engine_thread(corrupt)
        results = await asyncio.gather(*(_drain(s) for s in streams.values()), return_exceptions=True)
        return dict(zip(streams, results)), await engine.run_on_engine_thread(_state)

    results, state = run(main())
    assert isinstance(results["bad"], EngineStepError) and str(results["bad"]).endswith("request bad")
    for rid in ("ok-1", "ok-2"):
        final = results[rid][-1]
        assert final.finished and len(final.outputs[0].token_ids) == 12, rid
    assert state == IDLE
    assert "request bad failed in an engine step" in caplog.text and "out of vocab" in caplog.text
    assert engine.snapshot.num_step_errors >= 1


def test_a_request_refused_while_its_completions_are_built_holds_nothing(engine):
    """A seed below -1 used to fail after the request was queued: later steps then died with KeyError."""
    params = SamplingParams(max_tokens=3, temperature=1.0)
    params.seed = -2  # SamplingParams refuses it itself; set later, only the generator's creation can

    async def main():
        with pytest.raises(ValueError, match="non-negative"):
            await engine.add_request("bad-seed", "Hello", params)
        held = await engine.run_on_engine_thread(_state)
        outs = await _drain(await engine.add_request("after", "Hello", SamplingParams(max_tokens=3, seed=5)))
        return held, outs, await engine.run_on_engine_thread(_state)

    held, outs, state = run(main())
    assert held == IDLE and state == IDLE
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3


def test_a_large_n_fans_out_as_there_is_room_and_an_abort_stops_it(engine):
    n = 16384
    params = SamplingParams(n=n, max_tokens=4, temperature=1.0, seed=1)

    async def main():
        stream = await engine.add_request("many", "Hello", params)
        sizes = [await engine.run_on_engine_thread(_state)]
        seen = 0
        async for out in stream:
            sizes.append(await engine.run_on_engine_thread(_state))
            seen = max(seen, len(out.outputs))
            if sum(c.finish_reason is not None for c in out.outputs) >= 3 * MAX_NUM_SEQS:
                break
        stream.abort()  # what the server does when the client goes away
        await asyncio.sleep(0.2)
        return sizes, seen, await engine.run_on_engine_thread(_state)

    sizes, seen, state = run(main())
    # Completions hold engine state only while they run or wait (at most max_num_seqs of each), never n of them.
    assert max(s["live_children"] for s in sizes) <= 2 * MAX_NUM_SEQS
    assert max(s["scheduled"] for s in sizes) <= 2 * MAX_NUM_SEQS
    assert 3 * MAX_NUM_SEQS <= seen < n
    assert state == IDLE
