"""The FastAPI app: routes, the guard in front of them (guard.py), errors in each API's own shape."""
from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import engine
from engine.async_engine import EngineDeadError, EngineStepError
from engine.entrypoints.server import anthropic, embeddings, lora_routes, openai, openai_responses, openapi
from engine.entrypoints.server.errors import APIError, api_error_response, bad_request, error_response, \
    internal_error_message
from engine.entrypoints.server.guard import OPEN_PATHS, GuardMiddleware
from engine.entrypoints.server.limits import BODY_TIMEOUT_S, MAX_BODY_BYTES
from engine.entrypoints.server.protocol import DetokenizeRequest, TokenizeRequest
from engine.entrypoints.server.responses import (DetokenizeResponse, ModelCard, ModelList, TokenizeResponse,
                                                 VersionResponse)
from engine.entrypoints.server.serving import ServerState, state_of

logger = logging.getLogger("ramlm.server")


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


def build_app(state: ServerState, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
              body_timeout_s: float = BODY_TIMEOUT_S) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        state.engine.start()
        await asyncio.to_thread(state.templates.start)
        yield
        state.engine.shutdown()
        state.templates.close()
        state.tokenizer_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="ramlm", version=engine.__version__, lifespan=lifespan)
    app.state.ramlm = state
    openapi.install(app, api_key_required=bool(api_key), open_paths=OPEN_PATHS)
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes,
                       body_timeout_s=body_timeout_s)

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
    async def _step_failed(request: Request, exc: EngineStepError):  # the engine thread logged it
        return error_response(request.url.path, 500, internal_error_message(exc.request_id))

    @app.exception_handler(EngineDeadError)
    async def _dead(request: Request, exc: EngineDeadError):
        return error_response(request.url.path, 503, str(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        request_id = f"err-{uuid.uuid4().hex[:16]}"
        logger.error("request %s (%s %s) failed", request_id, request.method, request.url.path, exc_info=exc)
        return error_response(request.url.path, 500, internal_error_message(request_id))

    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(openai_responses.router)
    app.include_router(embeddings.router)
    app.include_router(lora_routes.router)

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
        return {"object": "list", "data": [_model_card(st, name) for name in [*st.model_names, *st.lora_modules]]}

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
            ids = await st.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False)
        else:
            tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
            _, ids = await st.render_chat(openai.chat_messages(body), body.add_generation_prompt,
                                          body.continue_final_message, template_kwargs=body.chat_template_kwargs,
                                          request_template=body.chat_template, tools=tools)
        strs = await st.off_loop(st.tokenizer.convert_ids_to_tokens, ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": st.max_model_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=openapi.errors(*openapi.REQUEST_ERRORS))
    async def detokenize(body: DetokenizeRequest, request: Request):
        st = state_of(request)
        st.check_model(body.model)
        return {"prompt": await st.off_loop(_detokenize, st.tokenizer, body.tokens)}

    return app


def _detokenize(tokenizer, tokens: list[int]) -> str:
    vocab = tokenizer.vocab_size
    bad = next((t for t in tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is outside the vocabulary (size {vocab})", "tokens")
    return tokenizer.decode(tokens, skip_special_tokens=False)


def _model_card(st: ServerState, name: str) -> dict:
    lora = st.lora_modules.get(name)
    if lora is not None:  # vLLM's card of an adapter: its path as root, the base model as parent
        return {"id": name, "object": "model", "created": st.created, "owned_by": "ramlm", "root": lora.lora_path,
                "parent": lora.base_model_name or st.model_names[0], "max_model_len": st.max_model_len}
    return {"id": name, "object": "model", "created": st.created, "owned_by": "ramlm", "root": st.model_names[0],
            "parent": None, "max_model_len": st.max_model_len}
