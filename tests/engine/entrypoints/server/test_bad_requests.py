"""Every kind of bad request gets the right status in its API's error shape, and harms nothing else."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.engine.entrypoints.server.conftest import MAX_BODY, MAX_MODEL_LEN, MODEL

CHAT = [{"role": "user", "content": "Hi"}]
LONG = "hello " * 600  # > MAX_MODEL_LEN tokens

# (id, method, path, body (dict, or bytes sent raw), expected status, substrings the message must hold)
CASES = [
    ("malformed-json", "/v1/completions", b'{"prompt": "x", ', 400, ["Malformed JSON"]),
    ("malformed-json-chat", "/v1/chat/completions", b"not json", 400, ["Malformed JSON"]),
    ("body-not-object", "/v1/completions", b"[1, 2]", 400, []),
    ("missing-prompt", "/v1/completions", {"model": MODEL}, 400, ["prompt"]),
    ("missing-messages", "/v1/chat/completions", {"model": MODEL}, 400, ["messages"]),
    ("empty-messages", "/v1/chat/completions", {"messages": []}, 400, ["messages"]),
    ("bad-role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, ["role"]),
    ("image-part", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, []),
    ("temperature-type", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, ["temperature"]),
    ("max-tokens-type", "/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, ["max_tokens"]),
    ("prompt-type", "/v1/completions", {"prompt": {"text": "x"}}, 400, ["prompt"]),
    ("n-float", "/v1/completions", {"prompt": "x", "n": 1.5}, 400, ["n"]),
    ("temperature-negative", "/v1/completions", {"prompt": "x", "temperature": -0.5}, 400, ["temperature"]),
    ("top-p-zero", "/v1/completions", {"prompt": "x", "top_p": 0.0}, 400, ["top_p"]),
    ("top-p-above-one", "/v1/chat/completions", {"messages": CHAT, "top_p": 1.5}, 400, ["top_p"]),
    ("n-zero", "/v1/completions", {"prompt": "x", "n": 0}, 400, ["n"]),
    ("max-tokens-zero", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, ["max_tokens"]),
    ("max-tokens-negative-chat", "/v1/chat/completions", {"messages": CHAT, "max_tokens": -3}, 400, ["max_tokens"]),
    ("max-completion-tokens-zero", "/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0}, 400,
     ["max_completion_tokens"]),
    ("logprobs-too-many", "/v1/completions", {"prompt": "x", "logprobs": 50}, 400, ["logprobs"]),
    ("top-logprobs-without-logprobs", "/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, 400,
     ["logprobs"]),
    ("top-k-negative", "/v1/completions", {"prompt": "x", "top_k": -5}, 400, ["top_k"]),
    ("empty-prompt-list", "/v1/completions", {"prompt": []}, 400, ["prompt"]),
    ("token-out-of-vocab", "/v1/completions", {"prompt": [2, 10**9]}, 400, ["vocabulary"]),
    ("stop-token-out-of-vocab", "/v1/completions", {"prompt": "x", "stop_token_ids": [10**9]}, 400, ["vocab"]),
    ("context-overflow", "/v1/completions", {"prompt": "Hello", "max_tokens": MAX_MODEL_LEN}, 400,
     [str(MAX_MODEL_LEN), f"{MAX_MODEL_LEN + 2}"]),
    ("context-overflow-chat", "/v1/chat/completions", {"messages": CHAT, "max_tokens": MAX_MODEL_LEN - 2}, 400,
     [str(MAX_MODEL_LEN), f"{MAX_MODEL_LEN - 2} in the completion"]),
    ("prompt-too-long", "/v1/completions", {"prompt": LONG, "max_tokens": 1}, 400, [str(MAX_MODEL_LEN)]),
    ("prompt-too-long-no-max", "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400,
     [str(MAX_MODEL_LEN)]),
    ("unknown-model", "/v1/completions", {"model": "gpt-9", "prompt": "x"}, 404, ["gpt-9"]),
    ("unknown-model-chat", "/v1/chat/completions", {"model": "gpt-9", "messages": CHAT}, 404, ["gpt-9"]),
    ("tokenize-nothing", "/tokenize", {}, 400, []),
    ("detokenize-bad-id", "/detokenize", {"tokens": [-1]}, 400, ["vocabulary"]),
    ("oversized-body", "/v1/completions", b'{"prompt": "' + b"a" * (MAX_BODY + 10) + b'"}', 413, [str(MAX_BODY)]),
    ("unknown-endpoint", "/v1/nothing-here", {}, 404, []),
    # Values that used to pass validation and then broke the engine (a seed below -1 was refused only after
    # it was queued: later requests failed with KeyError) or the server (n copied until RAM ran out).
    ("seed-below-minus-one", "/v1/completions", {"prompt": "x", "seed": -2}, 400, ["seed", "-1"]),
    ("seed-above-uint64", "/v1/chat/completions", {"messages": CHAT, "seed": 2**64}, 400, ["seed"]),
    ("n-huge", "/v1/completions", {"prompt": "x", "n": 10**9}, 400,
     ["n must be at most 16384", "RAMLM_MAX_N_SEQUENCES"]),
    ("best-of-above-n", "/v1/completions", {"prompt": "x", "best_of": 3}, 400, ["best_of must equal n"]),
    ("top-k-above-vocab", "/v1/completions", {"prompt": "x", "top_k": 10**9}, 400, ["top_k", "vocabulary size"]),
    ("logit-bias-not-an-id", "/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, 400, ["logit_bias"]),
    ("logit-bias-out-of-vocab", "/v1/completions", {"prompt": "x", "logit_bias": {str(10**9): 1}}, 400, ["vocab"]),
    # Floats must be finite and in range (JSON's NaN and Infinity literals included).
    ("repetition-penalty-infinity", "/v1/completions", b'{"prompt": "x", "repetition_penalty": Infinity}', 400,
     ["repetition_penalty", "finite"]),
    ("temperature-nan", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}', 400, ["temperature", "finite"]),
    ("top-p-infinity", "/v1/completions", b'{"prompt": "x", "top_p": Infinity}', 400, ["top_p"]),
    ("min-p-nan", "/v1/completions", b'{"prompt": "x", "min_p": NaN}', 400, ["min_p"]),
    ("presence-penalty-minus-infinity", "/v1/completions", b'{"prompt": "x", "presence_penalty": -Infinity}', 400,
     ["presence_penalty"]),
    ("frequency-penalty-nan", "/v1/completions", b'{"prompt": "x", "frequency_penalty": NaN}', 400,
     ["frequency_penalty"]),
    ("logit-bias-infinity", "/v1/completions", b'{"prompt": "x", "logit_bias": {"5": Infinity}}', 400,
     ["logit_bias"]),
    ("logit-bias-above-100", "/v1/completions", {"prompt": "x", "logit_bias": {"5": 150}}, 400,
     ["logit_bias", "[-100, 100]"]),
    # Lone surrogates (JSON \u escapes that do not pair up) anywhere in a body.
    ("surrogate-prompt", "/v1/completions", b'{"prompt": "a\\ud800"}', 400, ["prompt", "lone surrogate", "U+D800"]),
    ("surrogate-prompt-list", "/v1/completions", b'{"prompt": ["ok", "\\udfff b"]}', 400, ["prompt[1]"]),
    ("surrogate-chat", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi \\ud83d"}]}', 400,
     ["messages[0].content", "lone surrogate"]),
    ("surrogate-tokenize", "/tokenize", b'{"prompt": "\\udc00"}', 400, ["prompt", "lone surrogate"]),
    ("surrogate-model", "/v1/completions", b'{"model": "\\ud800", "prompt": "x"}', 400, ["model", "lone surrogate"]),
    ("surrogate-key", "/v1/completions", b'{"prompt": "x", "logit_bias": {"\\ud800": 1}}', 400, ["logit_bias"]),
    # A template from the request runs only on a server started with --trust-request-chat-template.
    ("request-chat-template", "/v1/chat/completions", {"messages": CHAT, "chat_template": "{{ 'x' }}"}, 400,
     ["--trust-request-chat-template", "chat_template"]),
    ("request-chat-template-kwarg", "/v1/chat/completions",
     {"messages": CHAT, "chat_template_kwargs": {"chat_template": "{{ 'x' }}"}}, 400, ["--trust-request-chat-template"]),
    ("request-chat-template-tokenize", "/tokenize", {"messages": CHAT, "chat_template": "{{ 'x' }}"}, 400,
     ["--trust-request-chat-template"]),
]


@pytest.mark.parametrize("name,path,body,status,words", CASES, ids=[c[0] for c in CASES])
def test_bad_request(http, name, path, body, status, words):
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = http.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error"}[status]
    for w in words:
        assert w in err["message"] or w == err["param"], (w, err)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic xyz"},
                                     {"x-api-key": "wrong"}], ids=["none", "wrong-bearer", "basic", "wrong-x-api-key"])
def test_missing_or_wrong_api_key_is_401(server, headers):
    for path, body in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": CHAT})):
        r = httpx.post(server.base_url + path, json=body, headers=headers, timeout=10)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server.base_url + "/v1/models", headers=headers, timeout=10).status_code == 401


def test_x_api_key_header_is_accepted(server):
    r = httpx.get(server.base_url + "/v1/models", headers={"x-api-key": server.api_key}, timeout=10)
    assert r.status_code == 200


def test_open_endpoints_need_no_key(server):
    for path in ("/health", "/version", "/metrics"):
        assert httpx.get(server.base_url + path, timeout=10).status_code == 200, path


def test_server_still_serves_after_bad_requests(http, server):
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 3, "temperature": 0.0})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    m = server.wait_idle()
    assert m["ramlm:kv_cache_used_blocks"] == 0 and m["ramlm:num_requests_running"] == 0


def test_bad_requests_do_not_disturb_a_running_stream(http, server):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with server.client() as other, other.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        first = next(ln for ln in lines if ln.startswith("data: "))
        for _, path, bad, status, _ in CASES:
            sent = http.post(path, content=bad, headers={"Content-Type": "application/json"}) \
                if isinstance(bad, bytes) else http.post(path, json=bad)
            assert sent.status_code == status
        rest = [ln for ln in lines if ln.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in [first] + rest[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 16
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
