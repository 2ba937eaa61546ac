"""What /openapi.json says beyond the request models: each route's 200 body (JSON, or server-sent events
when `stream` is true), the errors it can answer in its API's shape, and the API key.

FastAPI lists a 422 for every route with a body; this server never sends one (a request that fails
validation gets a 400), so the document drops it.
"""
from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from engine.entrypoints.server.responses import AnthropicErrorResponse, ErrorResponse

REF = "#/components/schemas/"
STREAM_PAYLOADS: dict[str, type[BaseModel]] = {}  # the events' data models, added to components/schemas
ERRORS = {
    400: "Malformed JSON, a wrong type, a value out of range, or a prompt that does not fit the context.",
    401: "The API key is missing or wrong (when the server was started with one).",
    404: "The model is not one this server serves.",
    413: "The request body is larger than the server's limit.",
    500: "The engine step that ran this request failed; the server goes on serving others.",
    503: "The engine is not running (the server is shutting down).",
}
REQUEST_ERRORS = (400, 401, 404, 413)
GENERATION_ERRORS = REQUEST_ERRORS + (500, 503)

METRICS = {200: {"description": "The Prometheus text format; OpenMetrics when the Accept header asks for it with "
                                 "escaping=allow-utf-8.",
                  "content": {"text/plain": {"schema": {"type": "string"}},
                              "application/openmetrics-text": {"schema": {"type": "string"}}}}}



def plain_text(description: str) -> dict:
    """A 200 response of plain text (vLLM's answers of the LoRA endpoints)."""
    return {200: {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}}


def errors(*codes: int, anthropic: bool = False) -> dict:
    """The `responses` entries of these status codes, in OpenAI's or Anthropic's error shape."""
    model = AnthropicErrorResponse if anthropic else ErrorResponse
    return {code: {"model": model, "description": ERRORS[code]} for code in codes}


def streamed(payload: type[BaseModel], done_marker: bool) -> dict:
    """The 200 response's second form, server-sent events when the request sets `stream: true`: the schema of
    one event, whose `data` is JSON of `payload` (OpenAI's streams may instead carry an error body, and end
    with `data: [DONE]`)."""
    name = payload.__name__
    STREAM_PAYLOADS.setdefault(name, payload)
    json_data = {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"$ref": f"{REF}{name}"}}
    if done_marker:
        json_data["contentSchema"] = {"anyOf": [{"$ref": f"{REF}{name}"}, {"$ref": f"{REF}ErrorResponse"}]}
        json_data = {"anyOf": [{"const": "[DONE]"}, json_data]}
    event = {"type": "object", "properties": {"event": {"type": "string"}, "data": json_data}, "required": ["data"],
             "description": f"One server-sent event; its data is JSON ({name})"
                            + (", or `[DONE]` at the end." if done_marker else ".")}
    return {200: {"description": "The result as JSON; with `stream: true`, server-sent events instead.",
                  "content": {"text/event-stream": {"schema": event}}}}


def no_content(ok: str, unavailable: str) -> dict:
    return {200: {"description": ok}, 503: {"description": unavailable}}


def install(app: FastAPI, api_key_required: bool, open_paths: tuple[str, ...]) -> None:
    """Makes app.openapi() return the document this module describes (built once, on first use)."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = generate()  # FastAPI caches it in app.openapi_schema; adjusted in place below
            _drop_validation_errors(doc)
            _add_models(doc, tuple(STREAM_PAYLOADS.values()))
            if api_key_required:
                _add_api_key(doc, open_paths)
        return app.openapi_schema

    app.openapi = openapi


def _drop_validation_errors(doc: dict) -> None:
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    schemas = doc.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)


def _add_models(doc: dict, models: tuple[type[BaseModel], ...]) -> None:
    _, top = models_json_schema([(m, "serialization") for m in models],
                                ref_template=REF + "{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in top.get("$defs", {}).items():
        schemas.setdefault(name, schema)


def _add_api_key(doc: dict, open_paths: tuple[str, ...]) -> None:
    doc.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY"},
        "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
    }
    for path, operations in doc.get("paths", {}).items():
        if path in open_paths:
            continue
        for operation in operations.values():
            operation["security"] = [{"bearer": []}, {"x-api-key": []}]

