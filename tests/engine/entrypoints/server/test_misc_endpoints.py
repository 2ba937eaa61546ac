"""/health, /version, /tokenize, /detokenize, /metrics."""
from __future__ import annotations

import re

import httpx

import engine
from tests.engine.entrypoints.server.conftest import MAX_MODEL_LEN, MODEL


def test_health_and_version(server):
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    assert httpx.get(server.base_url + "/version", timeout=10).json() == {"version": engine.__version__}


def test_tokenize_detokenize_round_trip(http):
    r = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello world", "return_token_strs": True}).json()
    assert r["count"] == len(r["tokens"]) == 3 and r["max_model_len"] == MAX_MODEL_LEN
    assert r["token_strs"][0] == "<bos>" and r["token_strs"][1] == "Hello"
    bare = http.post("/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}).json()
    assert bare["tokens"] == r["tokens"][1:] and bare["token_strs"] is None
    assert http.post("/detokenize", json={"tokens": bare["tokens"]}).json() == {"prompt": "Hello world"}
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == "<bos>Hello world"


def test_tokenize_messages_uses_the_chat_template(http):
    r = http.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}],
                                     "return_token_strs": True}).json()
    strs = r["token_strs"]
    assert strs[0] == "<bos>" and "<start_of_turn>" in strs and strs[-2:] == ["model", "\n"]


def _sample(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_metrics_prometheus_text(http, server):
    before = server.metrics()
    r = http.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 4, "temperature": 0.0,
                                           "ignore_eos": True})
    assert r.status_code == 200
    resp = httpx.get(server.base_url + "/metrics", timeout=10)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    for name, kind in [("ramlm:num_requests_running", "gauge"), ("ramlm:num_requests_waiting", "gauge"),
                       ("ramlm:kv_cache_usage_perc", "gauge"), ("ramlm:prefix_cache_hit_rate", "gauge"),
                       ("ramlm:kv_cache_used_blocks", "gauge"), ("ramlm:prompt_tokens_total", "counter"),
                       ("ramlm:generation_tokens_total", "counter"),
                       ("ramlm:num_requests_swapped", "gauge"), ("ramlm:cpu_cache_usage_perc", "gauge"),
                       ("ramlm:num_swap_outs_total", "counter"),
                       ("ramlm:time_to_first_token_seconds", "histogram"),
                       ("ramlm:time_per_output_token_seconds", "histogram")]:
        assert f"# TYPE {name} {kind}\n" in text and f"# HELP {name} " in text
    after = server.metrics()
    assert after["ramlm:generation_tokens_total"] - before["ramlm:generation_tokens_total"] == 4
    assert after["ramlm:prompt_tokens_total"] >= before["ramlm:prompt_tokens_total"]
    assert 0.0 <= after["ramlm:prefix_cache_hit_rate"] <= 1.0
    assert after["ramlm:num_requests_swapped"] == 0 and after["ramlm:num_swap_outs_total"] == 0  # no RAM tier here
    assert _sample(text, "ramlm:time_to_first_token_seconds_count") >= 1
    buckets = [float(v) for v in re.findall(r'^ramlm:time_to_first_token_seconds_bucket\{.*le="[^"]+"\} (\S+)$',
                                            text, re.M)]
    assert buckets == sorted(buckets) and buckets[-1] == _sample(text, "ramlm:time_to_first_token_seconds_count")
    assert re.search(r'le="\+Inf"', text)
    assert f'model_name="{MODEL}"' in text
