"""/v1/messages (Anthropic Messages API): plain, streamed event order, stop sequences, prefill, SDK."""
from __future__ import annotations

import json

import pytest

from tests.engine.entrypoints.server.conftest import MODEL

HI = [{"role": "user", "content": "Hi"}]


def _events(http, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) pairs of a streamed /v1/messages response."""
    out, name = [], None
    with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                out.append((name, data))
    return out


def test_message_plain(http):
    r = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": HI, "temperature": 0.0})
    assert r.status_code == 200
    m = r.json()
    assert m["type"] == "message" and m["role"] == "assistant" and m["model"] == MODEL
    assert m["id"].startswith("msg_")
    assert [b["type"] for b in m["content"]] == ["text"]
    assert m["stop_reason"] in ("end_turn", "max_tokens") and m["stop_sequence"] is None
    assert m["usage"]["input_tokens"] > 3 and 1 <= m["usage"]["output_tokens"] <= 5


def test_message_stream_event_order_and_text(http):
    body = {"model": MODEL, "max_tokens": 6, "messages": HI, "temperature": 0.0, "system": "Be brief."}
    events = _events(http, body)
    names = [n for n, _ in events]
    deltas = names[3:-3]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert deltas and set(deltas) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 3
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert all(d["delta"]["type"] == "text_delta" for n, d in events if n == "content_block_delta")
    final = events[-2][1]
    plain = http.post("/v1/messages", json=body).json()
    assert text == plain["content"][0]["text"]
    assert final["delta"]["stop_reason"] == plain["stop_reason"]
    assert final["usage"]["output_tokens"] == plain["usage"]["output_tokens"]


def test_message_max_tokens_stop_sequence_and_blocks(http):
    body = {"model": MODEL, "max_tokens": 12, "temperature": 0.0,
            "system": [{"type": "text", "text": "Answer in one sentence."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe Paris."}]}]}
    base = http.post("/v1/messages", json=body).json()
    text = base["content"][0]["text"]
    words = text.split()
    if base["stop_reason"] != "max_tokens" or len(words) < 3:
        pytest.skip(f"the model ended early: {text!r}")
    stop = words[2]
    cut = http.post("/v1/messages", json={**body, "stop_sequences": [stop]}).json()
    assert cut["stop_reason"] == "stop_sequence" and cut["stop_sequence"] == stop
    assert stop not in cut["content"][0]["text"]


def test_message_prefill_continues_the_assistant_turn(http):
    msgs = HI + [{"role": "assistant", "content": "Hello! My name is"}]
    r = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": msgs, "temperature": 0.0})
    assert r.status_code == 200
    count = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": msgs}).json()
    usage = r.json()["usage"]
    prompt = usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"]
    assert prompt == count["input_tokens"]


def test_message_errors_in_anthropic_shape(http, server):
    cases = [({"model": MODEL, "messages": HI}, 400),                       # max_tokens missing
             ({"model": MODEL, "max_tokens": 0, "messages": HI}, 400),
             ({"model": MODEL, "max_tokens": 4, "messages": []}, 400),
             ({"model": MODEL, "max_tokens": 4, "messages": HI, "temperature": 1.5}, 400),
             ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400),
             ({"model": "claude-nope", "max_tokens": 4, "messages": HI}, 404),
             ({"model": MODEL, "max_tokens": 100000, "messages": HI}, 400)]
    for body, status in cases:
        r = http.post("/v1/messages", json=body)
        assert r.status_code == status, (body, r.text)
        err = r.json()
        assert err["type"] == "error" and set(err["error"]) == {"type", "message"}, err
        assert err["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    import httpx
    r = httpx.post(server.base_url + "/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": HI})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_anthropic_sdk(server):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=60)
    greedy = {"temperature": 0.0}  # recent SDKs dropped the sampling keywords; the API still takes them
    msg = client.messages.create(model=MODEL, max_tokens=5, messages=HI, extra_body=greedy)
    assert msg.role == "assistant" and msg.content[0].type == "text"
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens >= 1
    with client.messages.stream(model=MODEL, max_tokens=5, messages=HI, extra_body=greedy) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == msg.content[0].text == final.content[0].text
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=5, messages=HI, extra_body={"temperature": -1.0})
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=5, messages=HI)
