"""The FastAPI app: routes, API-key and body-size guard, errors in each API's own shape."""
from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import engine
from engine.async_engine import EngineDeadError, EngineStepError
from engine.entrypoints.server import anthropic, openai, openapi
from engine.entrypoints.server.errors import APIError, api_error_response, bad_request, error_response
from engine.entrypoints.server.protocol import DetokenizeRequest, TokenizeRequest
from engine.entrypoints.server.responses import (DetokenizeResponse, ModelCard, ModelList, TokenizeResponse,
                                                 VersionResponse)
from engine.entrypoints.server.serving import ServerState, state_of

logger = logging.getLogger("ramlm.server")
DEFAULT_MAX_BODY_BYTES = 8 * 2**20
OPEN_PATHS = ("/health", "/version", "/metrics", "/ping")  # no API key needed
DRAIN_LIMIT = 64 * 2**20  # an oversized body is read (and dropped) up to this much so the client sees the 413


class GuardMiddleware:
    """Pure ASGI: rejects a missing/wrong API key (401) and bodies over max_body_bytes (413) before
    any route runs; the body it read is replayed to the app, and later receive() calls (disconnect
    notices) pass through."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

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
            message = await receive()
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


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    parts, param = [], None
    for err in errors[:5]:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx", {}) or {}
            parts.append(f"Malformed JSON in the request body: {ctx.get('error', err.get('msg'))}")
            continue
        field = ".".join(loc)
        param = param or (loc[0] if loc else None)
        msg = str(err.get("msg")).removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
        parts.append(f"{field}: {msg}" if field else msg)
    if len(errors) > 5:
        parts.append(f"... and {len(errors) - 5} more")
    return "; ".join(parts) or "invalid request", param


def build_app(state: ServerState, api_key: str | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        state.engine.start()
        yield
        state.engine.shutdown()

    app = FastAPI(title="ramlm", version=engine.__version__, lifespan=lifespan)
    app.state.ramlm = state
    openapi.install(app, api_key_required=bool(api_key), open_paths=OPEN_PATHS)
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return api_error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(request.url.path, 400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            detail = f"{request.method} {request.url.path}: no such endpoint"
        return error_response(request.url.path, exc.status_code, detail, headers=getattr(exc, "headers", None))

    @app.exception_handler(EngineStepError)
    async def _step_failed(request: Request, exc: EngineStepError):
        return error_response(request.url.path, 500, str(exc))

    @app.exception_handler(EngineDeadError)
    async def _dead(request: Request, exc: EngineDeadError):
        return error_response(request.url.path, 503, str(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        logger.exception("unhandled error on %s", request.url.path)
        return error_response(request.url.path, 500, f"internal error: {exc!r}")

    app.include_router(openai.router)
    app.include_router(anthropic.router)

    @app.get("/health", response_class=Response,
             responses=openapi.no_content("The engine is running.", "The engine is not running."))
    async def health(request: Request):
        if not state_of(request).engine.is_running:
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/ping", response_class=Response,
             responses=openapi.no_content("The engine is running.", "The engine is not running."))
    async def ping(request: Request):
        return await health(request)

    @app.get("/version", response_model=VersionResponse)
    async def version():
        return {"version": engine.__version__}

    @app.get("/v1/models", response_model=ModelList, responses=openapi.errors(401))
    async def models(request: Request):
        st = state_of(request)
        return {"object": "list", "data": [_model_card(st, name) for name in st.model_names]}

    @app.get("/v1/models/{name:path}", response_model=ModelCard, responses=openapi.errors(401, 404))
    async def model(name: str, request: Request):
        st = state_of(request)
        return _model_card(st, st.check_model(name))

    @app.get("/metrics", response_class=Response, responses=openapi.METRICS)
    async def metrics(request: Request):
        body, content_type = state_of(request).metrics.exposition(request.headers.get("accept"))
        return Response(body, media_type=content_type)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=openapi.errors(*openapi.REQUEST_ERRORS))
    async def tokenize(body: TokenizeRequest, request: Request):
        st = state_of(request)
        st.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give exactly one of prompt and messages", "prompt")
        if body.prompt is not None:
            ids = st.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False)
        else:
            msgs = [m.to_template() for m in body.messages]
            _, ids = st.render_chat(msgs, body.add_generation_prompt, body.continue_final_message)
        strs = st.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": st.max_model_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=openapi.errors(*openapi.REQUEST_ERRORS))
    async def detokenize(body: DetokenizeRequest, request: Request):
        st = state_of(request)
        st.check_model(body.model)
        vocab = st.tokenizer.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"token id {bad[0]} is outside the vocabulary (size {vocab})", "tokens")
        return {"prompt": st.tokenizer.decode(body.tokens, skip_special_tokens=False)}

    return app


def _model_card(st: ServerState, name: str) -> dict:
    return {"id": name, "object": "model", "created": st.created, "owned_by": "ramlm", "root": st.model_path,
            "parent": None, "max_model_len": st.max_model_len}
