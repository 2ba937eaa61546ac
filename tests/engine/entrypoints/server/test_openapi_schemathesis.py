"""schemathesis against the live server's /openapi.json: requests generated from the document (and known-good
ones, which reach the engine every time) get no 5xx, only documented status codes and content types, and
bodies (JSON, or each server-sent event's data) that conform to the documented schemas."""
from __future__ import annotations

import zlib

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                 status_code_conformance)

from tests.engine.entrypoints.server.conftest import API_KEY, MODEL

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# Values the document allows that only make a request long, capped so that the test stays short.
CAPS = {"n": 2, "best_of": 2, "max_tokens": 2, "max_completion_tokens": 2, "min_tokens": 1}
MAX_PROMPTS = 2  # of a completion request's list of prompts


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.base_url + "/openapi.json", headers=AUTH)


def _keep_short(case) -> None:
    """Caps what makes a request long (a missing or null max_tokens means 16 tokens, or the whole context in a
    chat), and names the served model in three cases out of four (any other name is a 404 before the engine)."""
    body = case.body
    if not isinstance(body, dict):
        return
    if case.path in ("/v1/completions", "/v1/chat/completions") and body.get("max_tokens") is None:
        body["max_tokens"] = CAPS["max_tokens"]
    for name, cap in CAPS.items():
        value = body.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > cap:
            body[name] = cap
    if isinstance(body.get("prompt"), list) and case.path == "/v1/completions":
        body["prompt"] = body["prompt"][:MAX_PROMPTS]
    if "model" in body and zlib.crc32(repr(sorted(body, key=str)).encode()) % 4:
        body["model"] = MODEL


def test_server_does_what_its_openapi_document_says(api_schema, server):
    """Every operation of the document, through schemathesis's generated cases (its public strategies, driven by
    hypothesis here rather than its pytest plugin, which follows pytest's internals)."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 8

    for op in operations:
        @given(case=op.as_strategy())
        @settings(max_examples=6, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            _keep_short(case)
            case.call_and_validate(base_url=server.base_url, headers=AUTH, checks=CHECKS, timeout=60)
        check()


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
HI = [{"role": "user", "content": "Hi"}]
# (method, path, body, status): requests that reach the engine every time, and two documented errors.
KNOWN = [
    ("GET", "/health", None, 200), ("GET", "/version", None, 200), ("GET", "/metrics", None, 200),
    ("GET", "/v1/models", None, 200),
    ("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 3, "n": 2, "temperature": 0.8, "seed": 1,
                                 "logprobs": 2, "echo": True}, 200),
    ("POST", "/v1/completions", {"prompt": ["Hi", "Yo"], "max_tokens": 3, "logprobs": 1, "stream": True,
                                 "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, 200),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "logprobs": True, "top_logprobs": 2,
                                      "stop": ["\n"]}, 200),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 3, "n": 2, "temperature": 1.0,
                                      "logprobs": True, "stream": True, "stream_options": {"include_usage": True}},
     200),
    ("POST", "/v1/messages", {"model": MODEL, "max_tokens": 3, "system": "Be brief.", "stop_sequences": ["\n"],
                              "messages": HI}, 200),
    ("POST", "/v1/messages", {"model": MODEL, "max_tokens": 3, "stream": True,
                              "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                                           {"role": "assistant", "content": "Hello, I am"}]}, 200),
    ("POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": HI}, 200),
    ("POST", "/tokenize", {"messages": CHAT, "return_token_strs": True}, 200),
    ("POST", "/tokenize", {"prompt": "Hello world"}, 200),
    ("POST", "/detokenize", {"tokens": [2, 9259]}, 200),
    ("POST", "/v1/chat/completions", {"messages": CHAT, "top_p": 0}, 400),
    ("POST", "/v1/messages", {"model": "nope", "max_tokens": 3, "messages": HI}, 404),
]


@pytest.mark.parametrize("method,path,body,status", KNOWN, ids=[f"{m} {p} {s}" for m, p, _, s in KNOWN])
def test_known_requests_match_the_document(api_schema, server, method, path, body, status):
    operation = api_schema[path][method]
    case = operation.Case() if body is None else operation.Case(body=body, media_type="application/json")
    response = case.call_and_validate(base_url=server.base_url, headers=AUTH, checks=CHECKS, timeout=60)
    assert response.status_code == status, response.text
    if body is not None and status == 200:
        expected = "text/event-stream" if body.get("stream") else "application/json"
        assert response.headers["content-type"][0].startswith(expected)


def test_document_lists_no_422_and_the_real_errors(server):
    doc = httpx.get(server.base_url + "/openapi.json", headers=AUTH, timeout=10).json()
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (method, path)
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "401", "404", "413"} <= set(chat)
    assert set(chat["200"]["content"]) == {"application/json", "text/event-stream"}
    request = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0} in request["top_p"]["anyOf"]
    assert chat["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    messages = doc["paths"]["/v1/messages"]["post"]["responses"]
    assert messages["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/AnthropicErrorResponse")
    assert "bearer" in doc["components"]["securitySchemes"]
