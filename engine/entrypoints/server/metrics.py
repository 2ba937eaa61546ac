"""/metrics through prometheus_client (the exposition library vLLM uses), one registry per server.

Engine gauges and counters are read from the engine thread's snapshot at scrape time (a custom
collector: the engine keeps the totals, so nothing is counted twice); the TTFT and TPOT histograms and
the finished-request counter are fed by the engine thread's hooks. Every sample carries model_name.
"""
from __future__ import annotations

from typing import Callable, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest

# vLLM's buckets.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
FINISH_REASONS = ("stop", "length", "abort")  # shown from the start, at 0

# (name, type, help, EngineSnapshot attribute); counters are named with their _total suffix.
ENGINE_METRICS = (
    ("ramlm:num_requests_running", "gauge", "Requests in the running batch.", "num_running"),
    ("ramlm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", "num_waiting"),
    ("ramlm:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks held by requests (1 = full).",
     "kv_cache_usage"),
    ("ramlm:kv_cache_used_blocks", "gauge", "KV-cache blocks held by requests.", "kv_used_blocks"),
    ("ramlm:kv_cache_total_blocks", "gauge", "Usable KV-cache blocks.", "kv_total_blocks"),
    ("ramlm:prefix_cache_hit_rate", "gauge", "Prompt tokens found in the prefix cache / looked up.",
     "prefix_cache_hit_rate"),
    ("ramlm:prompt_tokens_total", "counter", "Prompt tokens processed.", "prompt_tokens_total"),
    ("ramlm:generation_tokens_total", "counter", "Tokens generated.", "generation_tokens_total"),
    ("ramlm:num_preemptions_total", "counter", "Requests preempted for lack of KV blocks.", "num_preemptions"),
    ("ramlm:num_requests_swapped", "gauge", "Requests whose KV blocks wait in the RAM tier.", "num_swapped"),
    ("ramlm:cpu_cache_usage_perc", "gauge", "Fraction of the RAM tier's KV blocks in use (--num-cpu-blocks).",
     "cpu_kv_cache_usage"),
    ("ramlm:num_swap_outs_total", "counter", "Preemptions that swapped KV to the RAM tier.", "num_swap_outs"),
    ("ramlm:engine_step_errors_total", "counter", "Engine steps that raised.", "num_step_errors"),
    ("ramlm:spec_decode_num_drafts_total", "counter", "Speculative drafts checked (one per request and step).",
     "spec_decode_num_drafts"),
    ("ramlm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens checked.", "spec_decode_num_draft_tokens"),
    ("ramlm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
     "spec_decode_num_accepted_tokens"),
)


class _EngineCollector:
    """Reads the engine snapshot when scraped."""

    def __init__(self, model_name: str, snapshot: Callable[[], object]):
        self.model_name = model_name
        self.snapshot = snapshot

    def collect(self):
        snap = self.snapshot()
        for name, kind, help_, attr in ENGINE_METRICS:
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, help_,
                                                                                     labels=["model_name"])
            family.add_metric([self.model_name], float(getattr(snap, attr)))
            yield family


class ServerMetrics:
    """The server's registry: engine statistics, latency histograms, finished requests.

    Args:
        model_name: the served name (the model_name label).
        snapshot: returns the engine's latest EngineSnapshot (called at every scrape).
    """

    def __init__(self, model_name: str, snapshot: Callable[[], object]):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(model_name, snapshot))
        self.ttft = Histogram("ramlm:time_to_first_token_seconds", "Seconds to the first token.", ["model_name"],
                              buckets=TTFT_BUCKETS, registry=self.registry).labels(model_name)
        self.tpot = Histogram("ramlm:time_per_output_token_seconds",
                              "Mean seconds per output token after the first, per request.", ["model_name"],
                              buckets=TPOT_BUCKETS, registry=self.registry).labels(model_name)
        self.finished = Counter("ramlm:request_success", "Finished requests by finish reason (abort: client gone "
                                "or failed step).", ["model_name", "finished_reason"], registry=self.registry)
        self.model_name = model_name
        for reason in FINISH_REASONS:
            self.finished.labels(model_name, reason)

    # Hooks for AsyncLLMEngine (called on the engine thread; prometheus_client's metrics are thread-safe).
    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_finished(self, output, tpot: Optional[float]) -> None:
        if tpot is not None:
            self.tpot.observe(tpot)
        for c in output.outputs:
            self.finished.labels(self.model_name, c.finish_reason or "abort").inc()

    def on_aborted(self) -> None:
        self.finished.labels(self.model_name, "abort").inc()

    def exposition(self, accept: Optional[str]) -> tuple[bytes, str]:
        """The registry in the format the Accept header asks for (Prometheus text, or OpenMetrics where names
        may keep their colons); returns (body, content type)."""
        encoder, content_type = choose_encoder(accept or "")
        if content_type.startswith("application/openmetrics-text") and "escaping=allow-utf-8" not in content_type:
            # prometheus_client's OpenMetrics writer escapes the colons of sample names but not of their HELP and
            # TYPE lines; Prometheus' Accept header always offers the text format too.
            return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4
        return encoder(self.registry), content_type
