"""RequestStream: one request's outputs, as an async iterator, fed by AsyncLLMEngine's engine thread."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Optional

from engine.outputs import RequestOutput

if TYPE_CHECKING:
    from engine.async_engine import AsyncLLMEngine


class RequestStream:
    """Async iterator over one request's cumulative RequestOutputs.

    Outputs that queue up while the consumer is busy are coalesced into the latest one (they are
    cumulative, so nothing is lost). Cancelling the consumer, or calling abort(), aborts the request.
    """

    def __init__(self, request_id: str, engine: "AsyncLLMEngine", loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self._engine = engine
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.finished = False  # the consumer has seen the last output (or an error, or aborted)
        # Engine-thread timing, for the TTFT / TPOT histograms.
        self.arrival = time.monotonic()
        self.first_token_time: Optional[float] = None

    # Engine thread side.
    def _put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed (shutdown): nobody is listening
            pass

    # Consumer side.
    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except asyncio.CancelledError:
            self.abort()
            raise
        while not isinstance(item, BaseException) and not self._queue.empty():
            item = self._queue.get_nowait()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def abort(self) -> None:
        """Aborts the request unless it already finished; safe to call any number of times."""
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)

    async def aclose(self) -> None:
        self.abort()
