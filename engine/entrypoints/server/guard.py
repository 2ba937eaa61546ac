"""The ASGI guard in front of every route: API key (401), body size (413), body read timeout (408) and
lone surrogates in JSON bodies (400), all answered before any route runs."""
from __future__ import annotations

import asyncio
import hmac
import json
import re
from typing import Any, Optional

from engine.entrypoints.server.errors import error_response
from engine.entrypoints.server.limits import BODY_TIMEOUT_S, MAX_BODY_BYTES

OPEN_PATHS = ("/health", "/version", "/metrics", "/ping")  # no API key needed
DRAIN_LIMIT = 64 * 2**20  # an oversized body is read (and dropped) up to this much so the client sees the 413
# A lone surrogate can only arrive as a JSON \u escape (UTF-8 bytes cannot encode one): bodies without
# such an escape skip the scan.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class GuardMiddleware:
    """Pure ASGI: rejects a missing/wrong API key (401), bodies over max_body_bytes (413), bodies whose
    next part does not come within body_timeout_s (408, then the connection closes) and JSON bodies with
    a lone surrogate (400: no tokenizer or UTF-8 encoder takes one). The body it read is replayed to the
    app, and later receive() calls (disconnect notices) pass through."""

    def __init__(self, app, api_key: Optional[str], max_body_bytes: int = MAX_BODY_BYTES,
                 body_timeout_s: float = BODY_TIMEOUT_S):
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if self.api_key and path not in OPEN_PATHS and not self._authorized(headers):
            resp = error_response(path, 401, "Invalid or missing API key: send 'Authorization: Bearer KEY' "
                                             "or 'x-api-key: KEY'.", headers={"WWW-Authenticate": "Bearer"})
            return await resp(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        limit = self.max_body_bytes
        declared = headers.get(b"content-length", b"")
        too_big = declared.isdigit() and int(declared) > limit
        chunks, total = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout_s)
            except asyncio.TimeoutError:
                resp = error_response(path, 408, f"The request body stopped arriving: no data for "
                                                 f"{self.body_timeout_s:g} s.", headers={"Connection": "close"})
                return await resp(scope, receive, send)
            if message["type"] == "http.disconnect":
                return
            part = message.get("body", b"")
            total += len(part)
            if total > limit:
                too_big = True
            if not too_big:
                chunks.append(part)
            if not message.get("more_body", False) or total > limit + DRAIN_LIMIT:
                break
        if too_big:
            size = declared.decode() if declared.isdigit() else f"more than {total}"
            resp = error_response(path, 413, f"The request body ({size} bytes) is larger than this server's "
                                             f"limit of {limit} bytes.")
            return await resp(scope, receive, send)
        body = b"".join(chunks)
        if _SURROGATE_ESCAPE.search(body):
            found = _lone_surrogate_in_json(body)
            if found is not None:
                where, code_point = found
                field = re.match(r"\w*", where.removeprefix("a key of ")).group()
                resp = error_response(path, 400, f"{where or 'The body'} holds a lone surrogate (U+{code_point:04X}), "
                                                 "which is not valid Unicode text: \\u escapes of surrogates must "
                                                 "come in pairs.", field or None)
                return await resp(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    def _authorized(self, headers: dict) -> bool:
        key = self.api_key.encode()
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer " and hmac.compare_digest(auth[7:].strip(), key):
            return True
        return hmac.compare_digest(headers.get(b"x-api-key", b""), key)


def _lone_surrogate_in_json(body: bytes) -> Optional[tuple[str, int]]:
    try:
        data = json.loads(body)
    except ValueError:  # malformed: the route's parser reports it
        return None
    return find_lone_surrogate(data)


def find_lone_surrogate(value: Any) -> Optional[tuple[str, int]]:
    """(field path, code point) of the first lone surrogate in a parsed JSON value, or None."""
    if isinstance(value, str):
        cp = _lone_surrogate(value)
        return None if cp is None else ("", cp)
    stack = [(value, "")]
    while stack:  # containers only: a list of a million token ids costs no per-item allocation
        container, path = stack.pop()
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for k, x in items:
            if isinstance(k, str) and (cp := _lone_surrogate(k)) is not None:
                return (f"a key of {path}" if path else "a key"), cp
            if isinstance(x, str):
                if (cp := _lone_surrogate(x)) is not None:
                    return _join(path, k), cp
            elif isinstance(x, (dict, list, tuple)):
                stack.append((x, _join(path, k)))
    return None


def _lone_surrogate(text: str) -> Optional[int]:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return ord(e.object[e.start])
    return None


def _join(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key
