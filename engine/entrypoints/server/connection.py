"""uvicorn's h11 protocol with a request-header read timeout, which uvicorn lacks: its keep-alive timer
stops at a connection's first byte, so a client that sends half a request line holds the connection (and
a slot of --limit-concurrency) forever. The body's read timeout is the ASGI guard's (guard.py)."""
from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.entrypoints.server.limits import HEADER_TIMEOUT_S


class HeaderTimeoutH11Protocol(H11Protocol):
    """Request headers must be complete `header_timeout_s` after the connection opened, or after the first
    bytes of a later request on it: otherwise the client gets a 408 (or, if it sent nothing at all, just
    the close). Idle keep-alive connections stay uvicorn's (--timeout-keep-alive). Make one with
    `with_header_timeout`."""

    header_timeout_s: float = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:
        self._header_timer: asyncio.TimerHandle | None = None
        self._partial_request = False  # bytes of a request whose headers are not complete yet
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        idle = cycle is None or cycle.response_complete
        super().data_received(data)
        if self.cycle is not cycle:  # the headers are complete: a request began
            self._disarm_header_timer()
            self._partial_request = False
        elif idle and data:
            self._partial_request = True
            if self._header_timer is None:
                self._arm_header_timer()

    def connection_lost(self, exc) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return
        if self._partial_request:
            body = json.dumps({"error": {"message": f"The request headers did not arrive within "
                                                    f"{self.header_timeout_s:g} s.", "type": "invalid_request_error",
                                         "param": None, "code": None}}).encode()
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        self.transport.close()


def with_header_timeout(seconds: float) -> type[HeaderTimeoutH11Protocol]:
    """The protocol class to give uvicorn.Config(http=...)."""
    if not seconds > 0:
        raise ValueError(f"the header timeout must be positive, got {seconds}")
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,), {"header_timeout_s": float(seconds)})
