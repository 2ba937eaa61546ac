"""/metrics, read by prometheus_client's own parsers (Prometheus text and OpenMetrics): every metric with its
type, help and model_name label, counters and histograms moving with the traffic."""
from __future__ import annotations

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.entrypoints.server.conftest import MODEL

# family name (as the parser reports it) -> type; counters lose their _total suffix in the family name.
EXPECTED = {
    "ramlm:num_requests_running": "gauge", "ramlm:num_requests_waiting": "gauge",
    "ramlm:kv_cache_usage_perc": "gauge", "ramlm:kv_cache_used_blocks": "gauge",
    "ramlm:kv_cache_total_blocks": "gauge", "ramlm:prefix_cache_hit_rate": "gauge",
    "ramlm:prompt_tokens": "counter", "ramlm:generation_tokens": "counter", "ramlm:num_preemptions": "counter",
    "ramlm:num_requests_swapped": "gauge", "ramlm:cpu_cache_usage_perc": "gauge",
    "ramlm:num_swap_outs": "counter", "ramlm:engine_step_errors": "counter", "ramlm:request_success": "counter",
    "ramlm:time_to_first_token_seconds": "histogram", "ramlm:time_per_output_token_seconds": "histogram",
}


# What Prometheus 2.x and 3.x send when they scrape.
PROMETHEUS_ACCEPT = ["application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                     "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                     "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;"
                     "q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"]


def _families(server, accept: str | None = None) -> tuple[dict, str]:
    r = httpx.get(server.base_url + "/metrics", headers={"Accept": accept} if accept else {}, timeout=10)
    assert r.status_code == 200
    content_type = r.headers["content-type"]
    openmetrics = content_type.startswith("application/openmetrics-text")
    parse = parse_openmetrics if openmetrics else text_string_to_metric_families
    return {f.name: f for f in parse(r.text)}, content_type


def _value(family, name: str, **labels) -> float:
    found = [s.value for s in family.samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(found) == 1, (name, labels, family.samples)
    return found[0]


def test_metrics_parse_with_prometheus_client(server, http):
    before, content_type = _families(server)
    assert content_type.startswith("text/plain; version=")
    r = http.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 4, "temperature": 0.0,
                                           "ignore_eos": True})
    assert r.status_code == 200
    after, _ = _families(server)
    for name, kind in EXPECTED.items():
        family = after[name]
        assert family.type == kind and family.documentation, name
        assert all(s.labels.get("model_name") == MODEL for s in family.samples), name
    delta = (_value(after["ramlm:generation_tokens"], "ramlm:generation_tokens_total")
             - _value(before["ramlm:generation_tokens"], "ramlm:generation_tokens_total"))
    assert delta == 4
    prompt = r.json()["usage"]["prompt_tokens"]
    assert (_value(after["ramlm:prompt_tokens"], "ramlm:prompt_tokens_total")
            - _value(before["ramlm:prompt_tokens"], "ramlm:prompt_tokens_total")) == prompt
    done = "ramlm:request_success_total"
    assert (_value(after["ramlm:request_success"], done, finished_reason="length")
            - _value(before["ramlm:request_success"], done, finished_reason="length")) == 1
    assert 0.0 <= _value(after["ramlm:prefix_cache_hit_rate"], "ramlm:prefix_cache_hit_rate") <= 1.0
    assert _value(after["ramlm:num_requests_swapped"], "ramlm:num_requests_swapped") == 0  # no RAM tier here
    ttft = after["ramlm:time_to_first_token_seconds"]
    buckets = [(s.labels["le"], s.value) for s in ttft.samples if s.name.endswith("_bucket")]
    counts = [v for _, v in buckets]
    count = _value(ttft, "ramlm:time_to_first_token_seconds_count")
    assert buckets[-1][0] == "+Inf" and counts == sorted(counts) and counts[-1] == count >= 1
    assert (count - _value(before["ramlm:time_to_first_token_seconds"], "ramlm:time_to_first_token_seconds_count")
            == 1)


@pytest.mark.parametrize("accept", PROMETHEUS_ACCEPT + ["application/openmetrics-text; version=1.0.0"])
def test_what_a_scraper_asks_for_parses_with_every_type(server, accept):
    families, content_type = _families(server, accept)
    assert content_type.startswith(("text/plain", "application/openmetrics-text"))
    assert {name: f.type for name, f in families.items() if name in EXPECTED} == EXPECTED
    assert all(s.name.startswith("ramlm:") for f in families.values() for s in f.samples)


def test_openmetrics_with_utf8_names(server):
    _, content_type = _families(server, PROMETHEUS_ACCEPT[1])
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
