"""16 concurrent streaming clients, some hanging up early: the rest complete, the KV pool empties."""
from __future__ import annotations

import json
import threading

import httpx

from tests.engine.entrypoints.server.conftest import MODEL

NUM_CLIENTS = 16
QUITTERS = {1, 4, 7, 10, 13}  # these read one chunk and hang up
LONG = 200   # tokens a quitter asks for (it never waits for them)
SHORT = 8    # tokens a finisher asks for


def _request(i: int) -> tuple[str, dict]:
    max_tokens = LONG if i in QUITTERS else SHORT
    common = {"model": MODEL, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0.7,
              "seed": i}
    kind = i % 3
    if kind == 0:
        return "/v1/completions", {**common, "prompt": f"Story number {i}: once upon a time"}
    if kind == 1:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": f"Tell me fact {i}."}]}
    return "/v1/messages", {**common, "messages": [{"role": "user", "content": f"Hello {i}"}]}


def _client(server, i: int, results: dict, start: threading.Barrier) -> None:
    path, body = _request(i)
    lines = []
    try:
        with httpx.Client(base_url=server.base_url, timeout=120,
                          headers={"Authorization": f"Bearer {server.api_key}"}) as c:
            start.wait(timeout=30)
            with c.stream("POST", path, json=body) as r:
                results[i] = {"status": r.status_code}
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    lines.append(line[6:])
                    if i in QUITTERS and len(lines) >= 2:
                        break  # leaving the block closes the connection mid-stream
        results[i]["lines"] = lines
    except Exception as e:  # reported by the test
        results[i] = {"error": repr(e), "lines": lines}


def _finished_ok(path: str, lines: list[str]) -> bool:
    if path == "/v1/messages":
        events = [json.loads(x)["type"] for x in lines]
        return events[-1] == "message_stop" and "message_delta" in events
    if lines[-1] != "[DONE]":
        return False
    reasons = [ch["finish_reason"] for x in lines[:-1] for ch in json.loads(x)["choices"]]
    return reasons.count("length") == 1


def test_concurrent_streams_with_early_disconnects(server):
    before = server.wait_idle()
    results: dict = {}
    start = threading.Barrier(NUM_CLIENTS)
    threads = [threading.Thread(target=_client, args=(server, i, results, start), daemon=True)
               for i in range(NUM_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads), "a client hung"
    for i in range(NUM_CLIENTS):
        res = results.get(i, {})
        assert "error" not in res and res.get("status") == 200, (i, res)
        if i not in QUITTERS:
            assert _finished_ok(_request(i)[0], res["lines"]), (i, res["lines"][-3:])
    after = server.wait_idle()
    assert after["ramlm:num_requests_running"] == 0 and after["ramlm:num_requests_waiting"] == 0
    assert after["ramlm:kv_cache_used_blocks"] == 0 and after["ramlm:kv_cache_usage_perc"] == 0.0
    generated = after["ramlm:generation_tokens_total"] - before["ramlm:generation_tokens_total"]
    finishers = NUM_CLIENTS - len(QUITTERS)
    assert generated >= finishers * SHORT
    assert generated < finishers * SHORT + len(QUITTERS) * LONG  # the quitters were aborted early
    # And the server still answers.
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                   headers={"Authorization": f"Bearer {server.api_key}"}, timeout=60)
    assert r.status_code == 200


def test_non_streaming_client_that_hangs_up_is_aborted(server):
    before = server.wait_idle()
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True}
    try:
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=0.5,
                   headers={"Authorization": f"Bearer {server.api_key}"})
    except httpx.TimeoutException:
        pass
    after = server.wait_idle()
    assert after["ramlm:kv_cache_used_blocks"] == 0 and after["ramlm:num_requests_running"] == 0
    assert after["ramlm:generation_tokens_total"] - before["ramlm:generation_tokens_total"] < 480
