"""AsyncLLMEngine against a fake LLMEngine (no model): threading, errors, aborts, failing steps.

Also drives the FastAPI app in-process over the fake engine, to see a failing step reach clients
as errors while the server keeps serving.
"""
from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from engine.async_engine import AsyncLLMEngine, EngineStepError
from engine.outputs import CompletionOutput, RequestOutput
from engine.sample.sampling import SamplingParams
from tests.engine.entrypoints.server.conftest import metric_values


class FakeTokenizer:
    bos_token_id = 1
    add_bos_token = True
    vocab_size = 300

    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [ord(c) % 300 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i > 1)

    def convert_ids_to_tokens(self, ids):
        return [chr(i) for i in ids]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **kw):  # chat_cli's
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")
        return self.encode(text) if tokenize else text

    def get_chat_template(self, chat_template=None, tools=None):  # the server's; renders as apply_chat_template
        return chat_template or ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                                 "{% if add_generation_prompt %}<assistant>{% endif %}")


class FakeEngine:
    """Emits one token ('a'..) per step per request; step numbers in `fail_at` raise, and so does the
    first step that sees `fail_with_live` requests."""

    max_model_len = 64

    def __init__(self, fail_at=None, fail_with_live=None):
        self.tokenizer = FakeTokenizer()
        self.requests: dict[str, dict] = {}
        self.aborted: list[str] = []
        self.threads: set[str] = set()
        self.steps = 0
        self.fail_at = set(fail_at or ())
        self.fail_with_live = fail_with_live
        self.num_prompt_tokens = self.num_generation_tokens = 0
        self.kv_manager = SimpleNamespace(usage=0.0, num_usable_blocks=10, num_free_blocks=10, prefix_cache_hit_rate=0.0)

    def _seen(self):
        self.threads.add(threading.current_thread().name)

    def validate_request(self, ids, params):
        if len(ids) > self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than max_model_len ({self.max_model_len})")

    def add_request(self, rid, prompt, params, lora_request=None):
        self._seen()
        rid = rid if rid is not None else f"auto-{len(self.aborted) + self.steps}-{len(self.requests)}"
        ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else self.tokenizer.encode(prompt)
        if len(ids) > self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than max_model_len ({self.max_model_len})")
        self.requests[rid] = {"ids": list(ids), "out": [], "max": params.max_tokens}
        self.kv_manager.num_free_blocks -= 1
        return rid

    def abort_request(self, ids):
        self._seen()
        for rid in [ids] if isinstance(ids, str) else ids:
            if self.requests.pop(rid, None) is not None:
                self.aborted.append(rid)
                self.kv_manager.num_free_blocks += 1

    def has_unfinished_requests(self):
        return bool(self.requests)

    def step(self):
        self._seen()
        time.sleep(0.001)
        self.steps += 1
        if self.steps in self.fail_at:
            raise RuntimeError("kernel exploded")
        if self.fail_with_live and len(self.requests) >= self.fail_with_live:
            self.fail_with_live = None
            raise RuntimeError("kernel exploded")
        outs = []
        for rid, r in list(self.requests.items()):
            r["out"].append(ord("a") + len(r["out"]) % 26)
            self.num_generation_tokens += 1
            done = len(r["out"]) >= r["max"]
            c = CompletionOutput(0, "".join(map(chr, r["out"])), list(r["out"]), None, None,
                                 "length" if done else None)
            outs.append(RequestOutput(rid, None, r["ids"], None, [c], done))
            if done:
                del self.requests[rid]
                self.kv_manager.num_free_blocks += 1
        return outs

    def stats(self):
        return SimpleNamespace(num_running=len(self.requests), num_waiting=0, num_preemptions=0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def test_stream_runs_to_the_end_on_the_engine_thread():
    fake = FakeEngine()
    eng = AsyncLLMEngine(fake).start()

    async def main():
        outs = [o async for o in eng.generate("hi", SamplingParams(max_tokens=5), "r1")]
        return outs
    try:
        outs = run(main())
    finally:
        eng.shutdown()
    assert outs[-1].finished and outs[-1].outputs[0].text == "abcde"
    assert all(not o.finished for o in outs[:-1])
    assert fake.threads == {"ramlm-engine"}  # every engine call on the one engine thread
    assert fake.aborted == []


def test_build_makes_the_engine_on_the_engine_thread():
    made_on = []

    def make():
        made_on.append(threading.current_thread().name)
        return FakeEngine()
    eng = AsyncLLMEngine.build(make)
    try:
        assert made_on == ["ramlm-engine"] and eng.is_running
        outs = run(_collect(eng.generate("hi", SamplingParams(max_tokens=3), "r1")))
        assert outs[-1].outputs[0].text == "abc"
        assert eng.engine.threads == {"ramlm-engine"}
    finally:
        eng.shutdown()

    def broken():
        raise ValueError("no such model")
    with pytest.raises(ValueError, match="no such model"):
        AsyncLLMEngine.build(broken)


async def _collect(agen):
    return [o async for o in agen]


def test_add_request_errors_come_before_streaming():
    eng = AsyncLLMEngine(FakeEngine()).start()

    async def main():
        with pytest.raises(ValueError, match="max_model_len"):
            await eng.add_request("long", "x" * 100, SamplingParams(max_tokens=2))
        stream = await eng.add_request("ok", "x", SamplingParams(max_tokens=2))
        return [o async for o in stream]
    try:
        assert run(main())[-1].finished
    finally:
        eng.shutdown()


def test_cancelled_consumer_aborts_and_frees():
    fake = FakeEngine()
    eng = AsyncLLMEngine(fake).start()

    async def main():
        stream = await eng.add_request("r", "x", SamplingParams(max_tokens=10_000))

        async def consume():
            async for _ in stream:
                pass
        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if not fake.requests:
                break
            await asyncio.sleep(0.01)
    try:
        run(main())
    finally:
        eng.shutdown()
    assert fake.aborted == ["r"] and fake.kv_manager.num_free_blocks == 10
    assert eng.snapshot.kv_used_blocks == 0


def test_failing_step_fails_live_requests_and_the_loop_goes_on():
    fake = FakeEngine(fail_with_live=2)
    eng = AsyncLLMEngine(fake).start()

    async def main():
        a = await eng.add_request("a", "x", SamplingParams(max_tokens=100_000))
        b = await eng.add_request("b", "y", SamplingParams(max_tokens=100_000))
        for s in (a, b):
            with pytest.raises(EngineStepError, match=f"while running request {s.request_id}$"):
                async for _ in s:
                    pass
        return [o async for o in eng.generate("z", SamplingParams(max_tokens=3), "c")]
    try:
        outs = run(main())
    finally:
        eng.shutdown()
    assert outs[-1].finished and outs[-1].outputs[0].text == "abc"
    assert sorted(fake.aborted) == ["a", "b"] and eng.snapshot.num_step_errors == 1
    assert fake.kv_manager.num_free_blocks == 10


# ---- the HTTP layer over the fake engine ----
def _app(fake):
    from engine.entrypoints.server.app import build_app
    from engine.entrypoints.server.metrics import ServerMetrics
    from engine.entrypoints.server.serving import ServerState
    eng = AsyncLLMEngine(fake)
    metrics = ServerMetrics("fake", lambda: eng.snapshot)
    eng.set_hooks(on_first_token=metrics.on_first_token, on_finished=metrics.on_finished,
                  on_aborted=metrics.on_aborted)
    return eng, build_app(ServerState(eng, ["fake"], "/models/fake.gguf", metrics), api_key=None,
                          max_body_bytes=4096)


def test_failing_step_reaches_http_clients_as_errors():
    fake = FakeEngine(fail_at={2, 5})
    eng, app = _app(fake)
    eng.start()

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fake") as c:
            r = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 20})
            message = r.json()["error"]["message"]  # internals stay in the log, under the request id
            assert r.status_code == 500 and "kernel exploded" not in message
            assert re.fullmatch(r"Internal server error \(request id cmpl-\w+\); the server log has the details\.",
                                message), message
            r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                           "max_tokens": 20, "stream": True})
            assert r.status_code == 200
            lines = [ln for ln in r.text.splitlines() if ln.startswith("data: ")]
            assert "kernel exploded" not in lines[-2] and lines[-1] == "data: [DONE]"
            assert json.loads(lines[-2][6:])["error"]["message"].startswith("Internal server error (request id chatcmpl-")
            r = await c.post("/v1/messages", json={"model": "fake", "max_tokens": 3,
                                                   "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 200 and r.json()["content"][0]["text"] == "abc"
            r = await c.post("/v1/completions", content=b'{"prompt": "' + b"a" * 5000 + b'"}')
            assert r.status_code == 413
            m = (await c.get("/metrics")).text
            assert metric_values(m, model_name="fake")["ramlm:engine_step_errors_total"] == 2
            assert metric_values(m, finished_reason="abort")["ramlm:request_success_total"] == 2
            assert metric_values(m, finished_reason="length")["ramlm:request_success_total"] == 1
    try:
        run(main())
    finally:
        eng.shutdown()
    assert fake.kv_manager.num_free_blocks == 10
