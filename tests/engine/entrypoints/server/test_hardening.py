"""Requests meant to hurt the server: each is refused or cut off, nothing stays held, others are served."""
from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest

from tests.engine.entrypoints.server.conftest import (ALIAS, API_KEY, CHAT_TEMPLATE_TIMEOUT_S, HEADER_TIMEOUT_S,
                                                      BODY_TIMEOUT_S, LIMIT_CONCURRENCY, MAX_BODY, MODEL)

CHAT = [{"role": "user", "content": "Hi"}]
JSON = {"Content-Type": "application/json"}


def _assert_idle(server) -> None:
    m = server.wait_idle(timeout=60)
    assert (m["ramlm:num_requests_running"], m["ramlm:num_requests_waiting"], m["ramlm:kv_cache_used_blocks"]) \
        == (0, 0, 0), m


def _served(http) -> None:
    r = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "temperature": 0.0, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text


def test_a_refused_seed_holds_nothing_and_later_requests_run(http, server):
    for path, body in [("/v1/completions", {"prompt": "Hello", "seed": -2}),
                       ("/v1/chat/completions", {"messages": CHAT, "seed": 2**64}),
                       ("/v1/completions", {"prompt": "Hello", "n": 2, "temperature": 1.0, "seed": -7})]:
        r = http.post(path, json=body)
        assert r.status_code == 400 and "seed" in r.json()["error"]["message"], r.text
    for seed in (0, 2**64 - 1):
        r = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2, "seed": seed})
        assert r.status_code == 200, r.text
    _served(http)
    _assert_idle(server)


def test_a_disconnect_stops_a_large_n(server, http):
    body = {"prompt": "Once upon a time", "n": 16384, "max_tokens": 64, "ignore_eos": True, "temperature": 1.0}
    with server.client(timeout=httpx.Timeout(3.0)) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/completions", json=body)  # hangs up after 3 s, long before 16384 completions are done
    with server.client() as c, c.stream("POST", "/v1/chat/completions",
                                        json={"messages": CHAT, "stream": True, **body}) as r:
        assert r.status_code == 200
        next(ln for ln in r.iter_lines() if '"content": "' in ln and '"content": ""' not in ln)
    _assert_idle(server)
    _served(http)


def test_models_show_the_served_name_not_the_file(http):
    cards = http.get("/v1/models").json()["data"] + [http.get(f"/v1/models/{ALIAS}").json()]
    assert [c["root"] for c in cards] == [MODEL] * len(cards)
    assert not any("/" in json.dumps(c) for c in cards)


@pytest.mark.parametrize("path,body", [
    ("/v1/messages", b'{"model": "%s", "max_tokens": 4, "messages": [{"role": "user", "content": "a\\ud800"}]}'),
    ("/v1/messages", b'{"model": "%s", "max_tokens": 4, "system": "\\udfff", "messages": [{"role": "user", '
                     b'"content": "Hi"}]}'),
    ("/v1/messages/count_tokens", b'{"model": "%s", "messages": [{"role": "user", "content": [{"type": "text", '
                                  b'"text": "\\ud83d"}]}]}'),
    ("/v1/messages", b'{"model": "%s", "max_tokens": 4, "temperature": NaN, "messages": [{"role": "user", '
                     b'"content": "Hi"}]}'),
], ids=["content", "system", "count-tokens-block", "temperature-nan"])
def test_anthropic_refuses_bad_text_and_floats(http, path, body):
    r = http.post(path, content=body % MODEL.encode(), headers=JSON)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
    assert "lone surrogate" in err["error"]["message"] or "finite" in err["error"]["message"], err


def test_surrogate_pairs_are_text(http):
    r = http.post("/tokenize", content=b'{"prompt": "\\ud83d\\ude00", "add_special_tokens": false}', headers=JSON)
    assert r.status_code == 200, r.text
    assert http.post("/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"] == "\U0001F600"


def test_health_answers_while_a_big_prompt_is_tokenized(server):
    text = "".join(str(i % 10) for i in range(MAX_BODY - 1000))  # one token per digit: slow to tokenize
    done: dict = {}

    def tokenize() -> None:
        with server.client(timeout=120) as c, c.stream("POST", "/tokenize", json={"prompt": text,
                                                                               "return_token_strs": True}) as r:
            done["at"] = time.monotonic()  # the response began: tokenizing is over
            done["status"], done["count"] = r.status_code, json.loads(r.read()).get("count")

    worker = threading.Thread(target=tokenize)
    worker.start()
    time.sleep(0.2)  # the body is on its way or being tokenized
    health = httpx.get(server.base_url + "/health", timeout=60)
    health_at = time.monotonic()
    worker.join(timeout=120)
    assert health.status_code == 200 and done["status"] == 200 and done["count"] >= len(text)
    assert health_at < done["at"], "/health waited for the tokenizer"


# ---- connections: header and body read timeouts, the connection limit ----
def _connect(server) -> socket.socket:
    url = urlparse(server.base_url)
    return socket.create_connection((url.hostname, url.port), timeout=10)


def _read_to_close(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection; socket.timeout if it never does."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not part:
            return data
        data += part


HALF_HEADERS = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty"
HALF_BODY = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
             b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"x")


def test_half_sent_requests_are_cut_off_and_others_are_served(server, http):
    socks = {"headers": [], "body": [], "silent": []}
    for _ in range(20):
        s = _connect(server)
        s.sendall(HALF_HEADERS)
        socks["headers"].append(s)
    for _ in range(5):
        s = _connect(server)
        s.sendall(HALF_BODY)
        socks["body"].append(s)
    socks["silent"] = [_connect(server) for _ in range(5)]
    try:
        _served(http)  # while they hang
        assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
        limit = max(HEADER_TIMEOUT_S, BODY_TIMEOUT_S) + 15
        for s in socks["headers"]:
            reply = _read_to_close(s, limit)
            assert reply.startswith(b"HTTP/1.1 408 ") and b"request headers did not arrive" in reply, reply
        for s in socks["body"]:
            reply = _read_to_close(s, limit)
            assert reply.startswith(b"HTTP/1.1 408 ") and b"request body stopped arriving" in reply, reply
        for s in socks["silent"]:
            assert _read_to_close(s, limit) == b""
    finally:
        for s in sum(socks.values(), []):
            s.close()
    _served(http)
    _assert_idle(server)


def test_the_connection_limit_refuses_requests_until_connections_close(server):
    socks = []
    try:
        for _ in range(LIMIT_CONCURRENCY):
            s = _connect(server)
            s.sendall(HALF_HEADERS)
            socks.append(s)
        time.sleep(0.5)  # the server takes them in
        r = httpx.get(server.base_url + "/health", timeout=10)
        assert r.status_code == 503 and "Service Unavailable" in r.text
        for s in socks:
            assert _read_to_close(s, HEADER_TIMEOUT_S + 15).startswith(b"HTTP/1.1 408 ")
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 10
    while httpx.get(server.base_url + "/health", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "the server still refuses requests"
        time.sleep(0.1)


# ---- chat templates sent in requests (the trusting server) ----
SLOW_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def test_a_trusted_request_template_is_used(trusting_server):
    with trusting_server.client() as c:
        own = c.post("/tokenize", json={"prompt": "Q: Hi", "add_special_tokens": False}).json()["tokens"]
        for body in ({"messages": CHAT, "chat_template": "Q: {{ messages[0].content }}"},
                     {"messages": CHAT, "chat_template_kwargs": {"chat_template": "Q: {{ messages[0].content }}"}}):
            r = c.post("/tokenize", json=body)
            assert r.status_code == 200 and r.json()["tokens"][-len(own):] == own, r.text
        r = c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2,
                                                 "chat_template": "{{ bos_token }}Q: {{ messages[0].content }}"})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(own) + 1, r.text
        r = c.post("/v1/chat/completions", json={"messages": CHAT, "chat_template": "{{ raise_exception('no') }}"})
        assert r.status_code == 400 and "no" in r.json()["error"]["message"], r.text


def test_a_slow_request_template_is_stopped_and_health_answers_meanwhile(trusting_server):
    done: dict = {}

    def chat() -> None:
        with trusting_server.client(timeout=120) as c:
            r = c.post("/v1/chat/completions", json={"messages": CHAT, "chat_template": SLOW_TEMPLATE})
        done["status"], done["message"], done["at"] = r.status_code, r.json()["error"]["message"], time.monotonic()

    worker = threading.Thread(target=chat)
    worker.start()
    time.sleep(0.5)
    health = httpx.get(trusting_server.base_url + "/health", timeout=60)
    health_at = time.monotonic()
    worker.join(timeout=120)
    assert health.status_code == 200 and health_at < done["at"]
    assert done["status"] == 400 and f"within {CHAT_TEMPLATE_TIMEOUT_S:g} s" in done["message"], done
    with trusting_server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2})
        assert r.status_code == 200, r.text
