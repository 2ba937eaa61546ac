"""/metrics in the Prometheus text format (0.0.4), written by hand: gauges and counters from the
engine thread's snapshot, TTFT and TPOT histograms fed by the engine thread's hooks."""
from __future__ import annotations

import bisect
import threading

# vLLM's buckets.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)


class Histogram:
    """Cumulative-bucket histogram; observe() from any thread."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.buckets, value)] += 1
            self.sum += value
            self.count += 1

    def render(self, name: str, labels: str) -> list[str]:
        with self._lock:
            counts, total, n = list(self.counts), self.sum, self.count
        lines, acc = [], 0
        for le, c in zip(self.buckets + (float("inf"),), counts):
            acc += c
            le_s = "+Inf" if le == float("inf") else _num(le)
            lines.append(f'{name}_bucket{{{labels}{"," if labels else ""}le="{le_s}"}} {acc}')
        lines.append(f"{name}_sum{{{labels}}} {_num(total)}")
        lines.append(f"{name}_count{{{labels}}} {n}")
        return lines


class ServerMetrics:
    """Everything /metrics shows besides the engine snapshot."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.requests_finished = {"stop": 0, "length": 0, "abort": 0}

    # Hooks for AsyncLLMEngine (called on the engine thread).
    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_finished(self, output, tpot) -> None:
        if tpot is not None:
            self.tpot.observe(tpot)
        for c in output.outputs:
            reason = c.finish_reason or "abort"
            self.requests_finished[reason] = self.requests_finished.get(reason, 0) + 1

    def on_aborted(self) -> None:
        self.requests_finished["abort"] += 1

    def render(self, snap) -> str:
        labels = f'model_name="{_escape(self.model_name)}"'
        out: list[str] = []

        def metric(name, kind, help_, value):
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {_num(value)}"])

        metric("ramlm:num_requests_running", "gauge", "Requests in the running batch.", snap.num_running)
        metric("ramlm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", snap.num_waiting)
        metric("ramlm:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks held by requests (1 = full).",
               snap.kv_cache_usage)
        metric("ramlm:kv_cache_used_blocks", "gauge", "KV-cache blocks held by requests.", snap.kv_used_blocks)
        metric("ramlm:kv_cache_total_blocks", "gauge", "Usable KV-cache blocks.", snap.kv_total_blocks)
        metric("ramlm:prefix_cache_hit_rate", "gauge", "Prompt tokens found in the prefix cache / looked up.",
               snap.prefix_cache_hit_rate)
        metric("ramlm:prompt_tokens_total", "counter", "Prompt tokens processed.", snap.prompt_tokens_total)
        metric("ramlm:generation_tokens_total", "counter", "Tokens generated.", snap.generation_tokens_total)
        metric("ramlm:num_preemptions_total", "counter", "Requests preempted for lack of KV blocks.",
               snap.num_preemptions)
        metric("ramlm:num_requests_swapped", "gauge", "Requests whose KV blocks wait in the RAM tier.",
               snap.num_swapped)
        metric("ramlm:cpu_cache_usage_perc", "gauge", "Fraction of the RAM tier's KV blocks in use (--num-cpu-blocks).",
               snap.cpu_kv_cache_usage)
        metric("ramlm:num_swap_outs_total", "counter", "Preemptions that swapped KV to the RAM tier.",
               snap.num_swap_outs)
        metric("ramlm:engine_step_errors_total", "counter", "Engine steps that raised.", snap.num_step_errors)
        name = "ramlm:request_success_total"
        out += [f"# HELP {name} Finished requests by finish reason (abort: client gone or failed step).",
                f"# TYPE {name} counter"]
        for reason, n in sorted(dict(self.requests_finished).items()):
            out.append(f'{name}{{{labels},finished_reason="{reason}"}} {n}')
        for name, hist, help_ in (("ramlm:time_to_first_token_seconds", self.ttft, "Seconds to the first token."),
                                  ("ramlm:time_per_output_token_seconds", self.tpot,
                                   "Mean seconds per output token after the first, per request.")):
            out += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
            out += hist.render(name, labels)
        return "\n".join(out) + "\n"


def _num(v) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    return repr(float(v))


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name (with labels stripped) -> value; the first sample of each name wins (tests, tools)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0]
        values.setdefault(name, float(value))
    return values
