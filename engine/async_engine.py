"""AsyncLLMEngine: LLMEngine behind one engine thread, for asyncio callers (the server).

The scheduler is not thread-safe, so every LLMEngine call (add, abort, step) runs on the one engine
thread. Callers talk to it through a command deque: add_request enqueues ("add", ...) and awaits a
future (so a bad request raises ValueError before anything streams); abort enqueues ("abort", id)
and returns at once (it is called from `finally` blocks and cancellations). The thread processes
commands between steps, steps while requests exist and sleeps on an event otherwise. Outputs go to
a per-request asyncio.Queue through loop.call_soon_threadsafe.

A request that fails inside a step (LLMEngine.step raises RequestsFailed naming it) gets EngineStepError
and the step's other requests go on; a step failure that names no request fails every live request. Either
way the failed requests' blocks are freed, the exception goes to the log with their ids, and the loop goes
on serving.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional

from engine.errors import RequestsFailed
from engine.outputs import RequestOutput
from engine.request_stream import RequestStream
from engine.sample.sampling import SamplingParams

logger = logging.getLogger("ramlm.async_engine")


class EngineStepError(RuntimeError):
    """The engine step that was running this request failed; the request was aborted.

    The message names the request only: what went wrong is in the server log, under the request id.
    """

    def __init__(self, request_id: str):
        super().__init__(f"the engine failed while running request {request_id}")
        self.request_id = request_id


class EngineDeadError(RuntimeError):
    """The engine thread is not running (shut down)."""


@dataclass
class EngineSnapshot:
    """Statistics copied by the engine thread after every step and command (read by /metrics)."""
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    kv_used_blocks: int = 0
    kv_total_blocks: int = 0
    prefix_cache_hit_rate: float = 0.0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_preemptions: int = 0
    num_swap_outs: int = 0
    num_swapped: int = 0
    cpu_kv_cache_usage: float = 0.0
    num_step_errors: int = 0
    spec_decode_num_drafts: int = 0  # speculative decoding (vLLM's counters)
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0


@dataclass
class _Add:
    request_id: str
    prompt: Any
    params: SamplingParams
    stream: RequestStream
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    lora_request: Any = None


@dataclass
class _Call:  # run fn(engine) on the engine thread (tests, maintenance)
    fn: Callable
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class _Hooks:
    on_first_token: Optional[Callable[[float], None]] = None   # seconds from arrival to the first token
    on_finished: Optional[Callable[[RequestOutput, Optional[float]], None]] = None  # (output, mean TPOT)
    on_aborted: Optional[Callable[[], None]] = None  # a live request was aborted (disconnect, failed step)


class AsyncLLMEngine:
    """Wraps an LLMEngine (or anything with its add_request/step/abort_request/has_unfinished_requests).

    Args:
        engine: the LLMEngine; owned by the engine thread from start() on.
        on_first_token, on_finished, on_aborted: optional callbacks, called on the engine thread, for metrics.
    """

    def __init__(self, engine, on_first_token=None, on_finished=None, on_aborted=None):
        self.engine = engine
        self.hooks = _Hooks(on_first_token, on_finished, on_aborted)
        self._commands: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._stop = False
        self._streams: dict[str, RequestStream] = {}  # engine thread only
        self._thread: Optional[threading.Thread] = None
        self.snapshot = EngineSnapshot()

    @classmethod
    def build(cls, make_engine: Callable[[], Any], **kw) -> "AsyncLLMEngine":
        """Runs make_engine() on the engine thread itself, then that thread's loop; returns (running) once the
        engine is built, or raises make_engine's error. Loading there means every Numba parallel region starts
        from one thread: a second starting thread gets a second libgomp worker pool, and with more pool
        threads than cores libgomp stops spin-waiting, so each launch sleeps and wakes (a served 16-row decode
        step ran 1.3x slower)."""
        self = cls(None, **kw)
        built = threading.Event()
        failed: list[BaseException] = []

        def main() -> None:
            try:
                self.engine = make_engine()
            except BaseException as e:  # handed to the caller below
                failed.append(e)
                return
            finally:
                built.set()
            self._run()

        self._thread = threading.Thread(target=main, name="ramlm-engine", daemon=True)
        self._thread.start()
        built.wait()
        if failed:
            self._thread.join()
            self._thread = None
            raise failed[0]
        return self

    def set_hooks(self, on_first_token=None, on_finished=None, on_aborted=None) -> None:
        """The metrics callbacks (when they need the built engine, e.g. its model's name)."""
        self.hooks = _Hooks(on_first_token, on_finished, on_aborted)

    # ---- passthroughs (immutable after load, safe from any thread) ----
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """LLMEngine.validate_request on the caller's thread (it reads only what never changes after load):
        every admission check, before anything is queued. Raises ValueError / TypeError."""
        self.engine.validate_request(prompt_token_ids, params)

    # ---- lifecycle ----
    def start(self) -> "AsyncLLMEngine":
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._run, name="ramlm-engine", daemon=True)
            self._thread.start()
        return self

    def stop_soon(self) -> None:
        """Asks the engine thread to stop without waiting: live requests fail with EngineDeadError
        (streams end), new ones are refused. Safe from a signal handler."""
        self._stop = True
        self._wake.set()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop

    # ---- caller side (event loop) ----
    async def add_request(self, request_id: str, prompt: Any, params: SamplingParams,
                          lora_request: Any = None) -> RequestStream:
        """Queues a request (with its LoRA adapter, a lora.LoRARequest or None); returns its stream once the engine
        accepted it.

        Raises:
            ValueError / TypeError: the engine rejected the request (prompt too long, bad token ids, ...).
            EngineDeadError: the engine thread is not running.
        """
        if not self.is_running:
            raise EngineDeadError("the engine is not running")
        loop = asyncio.get_running_loop()
        stream = RequestStream(request_id, self, loop)
        fut = loop.create_future()
        self._commands.append(_Add(request_id, prompt, params, stream, fut, loop, lora_request))
        self._wake.set()
        try:
            await fut
        except asyncio.CancelledError:
            self.abort(request_id)  # the caller went away while the request was being queued
            raise
        return stream

    async def generate(self, prompt: Any, params: SamplingParams, request_id: str) -> AsyncIterator[RequestOutput]:
        """add_request + iterate; aborts the request if the consumer stops early."""
        stream = await self.add_request(request_id, prompt, params)
        try:
            async for out in stream:
                yield out
        finally:
            stream.abort()

    def abort(self, request_id: str) -> None:
        """Aborts a request (frees its KV blocks); returns at once, from any thread."""
        self._commands.append(("abort", request_id))
        self._wake.set()

    async def run_on_engine_thread(self, fn: Callable[[Any], Any]) -> Any:
        """Runs fn(llm_engine) on the engine thread between steps and returns its result."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._commands.append(_Call(fn, fut, loop))
        self._wake.set()
        return await fut

    # ---- engine thread ----
    def _run(self) -> None:
        while not self._stop:
            try:
                self._drain_commands()
                if self.engine.has_unfinished_requests():
                    self._step()
                else:
                    self._update_snapshot()
                    self._wake.wait(timeout=1.0)
                    self._wake.clear()
            except Exception:  # a bug outside step: fail what is live, keep the thread alive
                logger.exception("engine loop error; failing the live requests %s", ", ".join(self._streams))
                self._fail_all(EngineStepError)
                time.sleep(0.01)
        self._drain_commands()
        self._fail_all(lambda rid: EngineDeadError("the engine was shut down"))

    def _drain_commands(self) -> None:
        while self._commands:
            cmd = self._commands.popleft()
            if isinstance(cmd, tuple):  # ("abort", id)
                self._abort(cmd[1])
            elif isinstance(cmd, _Add):
                self._add(cmd)
            else:
                try:
                    _resolve(cmd.loop, cmd.future, cmd.fn(self.engine), None)
                except Exception as e:
                    _resolve(cmd.loop, cmd.future, None, e)
        self._update_snapshot()

    def _add(self, cmd: _Add) -> None:
        if self._stop:
            _resolve(cmd.loop, cmd.future, None, EngineDeadError("the engine was shut down"))
            return
        try:
            self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params, lora_request=cmd.lora_request)
        except Exception as e:
            _resolve(cmd.loop, cmd.future, None, e)
            return
        cmd.stream.arrival = time.monotonic()
        self._streams[cmd.request_id] = cmd.stream
        _resolve(cmd.loop, cmd.future, None, None)

    def _abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self.engine.abort_request(request_id)
            self._hook(self.hooks.on_aborted)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except RequestsFailed as e:
            self.snapshot.num_step_errors += 1
            for rid, error in e.failures.items():
                logger.error("request %s failed in an engine step; aborted", rid, exc_info=error)
                self._fail_one(rid)
            outputs = e.outputs
        except Exception:
            logger.exception("engine step failed; failing the live requests %s", ", ".join(self._streams))
            self.snapshot.num_step_errors += 1
            self._fail_all(EngineStepError)
            return
        now = time.monotonic()
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if stream.first_token_time is None and any(c.token_ids for c in out.outputs):
                stream.first_token_time = now
                self._hook(self.hooks.on_first_token, now - stream.arrival)
            if out.finished:
                del self._streams[out.request_id]
                ntok = max((len(c.token_ids) for c in out.outputs), default=0)
                tpot = (now - stream.first_token_time) / (ntok - 1) if ntok > 1 and stream.first_token_time else None
                self._hook(self.hooks.on_finished, out, tpot)
            stream._put(out)
        self._update_snapshot()

    def _hook(self, fn, *args) -> None:
        if fn is not None:
            try:
                fn(*args)
            except Exception:
                logger.exception("metrics hook failed")

    def _fail_one(self, request_id: str) -> None:
        """A request the engine already aborted: its stream ends with EngineStepError."""
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            self._hook(self.hooks.on_aborted)
            stream._put(EngineStepError(request_id))

    def _fail_all(self, make_error: Callable[[str], BaseException]) -> None:
        """Aborts every live request; each stream ends with make_error(request_id)."""
        ids = list(self._streams)
        for rid in ids:
            stream = self._streams.pop(rid)
            try:
                self.engine.abort_request(rid)
            except Exception:
                logger.exception("abort of %s failed", rid)
            self._hook(self.hooks.on_aborted)
            stream._put(make_error(rid))
        # Requests the engine holds without a stream (should not happen) must not keep it busy forever.
        try:
            if self.engine.has_unfinished_requests():
                self.engine.abort_request(list(getattr(self.engine, "parents", {})))
        except Exception:
            logger.exception("cleanup after a failed step failed")
        self._update_snapshot()

    def _update_snapshot(self) -> None:
        e = self.engine
        try:
            st = e.stats()
            kv = e.kv_manager
            used = kv.num_usable_blocks - kv.num_free_blocks
            self.snapshot = EngineSnapshot(
                num_running=st.num_running, num_waiting=st.num_waiting, kv_cache_usage=kv.usage,
                kv_used_blocks=used, kv_total_blocks=kv.num_usable_blocks,
                prefix_cache_hit_rate=kv.prefix_cache_hit_rate, prompt_tokens_total=e.num_prompt_tokens,
                generation_tokens_total=e.num_generation_tokens,
                num_preemptions=getattr(st, "num_preemptions", 0),
                num_swap_outs=st.num_swap_outs, num_swapped=st.num_swapped,
                cpu_kv_cache_usage=st.cpu_kv_cache_usage,
                num_step_errors=self.snapshot.num_step_errors, **_spec_counters(e))
        except Exception:  # statistics must never take the loop down
            logger.debug("snapshot failed", exc_info=True)


def _spec_counters(engine) -> dict:
    spec = getattr(engine, "spec_stats", None)  # engines without speculative decoding (test doubles) have none
    if spec is None:
        return {}
    return {"spec_decode_num_drafts": spec.num_drafts, "spec_decode_num_draft_tokens": spec.num_draft_tokens,
            "spec_decode_num_accepted_tokens": spec.num_accepted_tokens}


def _resolve(loop: asyncio.AbstractEventLoop, fut: asyncio.Future, result, error) -> None:
    def set_it():
        if fut.done():  # the caller was cancelled meanwhile
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    try:
        loop.call_soon_threadsafe(set_it)
    except RuntimeError:  # loop closed
        pass
