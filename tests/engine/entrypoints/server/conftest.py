"""One real `ramlm serve` subprocess for the whole tests/engine/entrypoints/server package (package-scoped fixture).

It runs the embedded gemma-3-270m on a free 127.0.0.1 port with an API key, two served model names,
a 1 MiB body limit, short header and body read timeouts and a connection limit, so the same server
exercises auth, model names, 413s, 408s and 503s. A second one (`trusting_server`, started only by the
tests that use it) trusts chat templates sent in requests and stops slow ones after a short time.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[4]
API_KEY = "test-key-123"
MODEL = "ramlm-test"
ALIAS = "gemma-alias"
MAX_MODEL_LEN = 512
MAX_BODY = 1 << 20
START_TIMEOUT_S = 300  # a cold Numba cache compiles the kernels first
HEADER_TIMEOUT_S = 3.0
BODY_TIMEOUT_S = 3.0
LIMIT_CONCURRENCY = 64
CHAT_TEMPLATE_TIMEOUT_S = 2.0


@dataclass
class Server:
    base_url: str
    api_key: str
    model: str
    log_path: str

    def client(self, **kw) -> httpx.Client:
        kw.setdefault("timeout", 60.0)
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {self.api_key}"}, **kw)

    def metrics(self) -> dict[str, float]:
        return metric_values(httpx.get(self.base_url + "/metrics", timeout=10).text)

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """Polls /metrics until nothing runs or waits and no KV block is held; returns the last values."""
        deadline = time.monotonic() + timeout
        m = self.metrics()
        while time.monotonic() < deadline:
            if (m["ramlm:num_requests_running"] == 0 and m["ramlm:num_requests_waiting"] == 0
                    and m["ramlm:kv_cache_used_blocks"] == 0):
                return m
            time.sleep(0.1)
            m = self.metrics()
        return m

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")[-5000:]


def metric_values(text: str, **labels: str) -> dict[str, float]:
    """Sample name -> value of /metrics text, read by prometheus_client's own parser; the first sample of
    each name whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if labels.items() <= sample.labels.items():
                values.setdefault(sample.name, sample.value)
    return values


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(*extra_args: str, env: dict | None = None):
    """A `ramlm serve` subprocess on a free port, answering /health; stopped on exit. env: variables set for it (the
    API key's and the runtime-LoRA switch from this process's environment are not passed on)."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w", prefix="ramlm-serve-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "engine.entrypoints.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory", "0.5", "--api-key", API_KEY,
           "--served-model-name", MODEL, ALIAS, "--max-request-body-bytes", str(MAX_BODY),
           "--disable-access-log", "--uvicorn-log-level", "warning", *extra_args]
    env = {**{k: v for k, v in os.environ.items() if k not in ("RAMLM_API_KEY", "VLLM_ALLOW_RUNTIME_LORA_UPDATING")},
           **(env or {})}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    srv = Server(f"http://127.0.0.1:{port}", API_KEY, MODEL, log.name)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}:\n{srv.log()}")
            try:
                if httpx.get(srv.base_url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer /health in {START_TIMEOUT_S} s:\n{srv.log()}")
            time.sleep(0.25)
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()
        os.unlink(log.name)


@pytest.fixture(scope="package")
def server():
    with running_server("--timeout-request-headers", str(HEADER_TIMEOUT_S), "--timeout-request-body",
                        str(BODY_TIMEOUT_S), "--limit-concurrency", str(LIMIT_CONCURRENCY)) as srv:
        yield srv


@pytest.fixture(scope="package")
def trusting_server():
    with running_server("--trust-request-chat-template", "--chat-template-timeout", str(CHAT_TEMPLATE_TIMEOUT_S)) as srv:
        yield srv


@pytest.fixture(scope="package")
def http(server):
    with server.client() as c:
        yield c


AGENT_TEMPLATE = Path(__file__).with_name("agent_template.jinja")


@pytest.fixture(scope="package")
def agent_server():
    """Tool calls in the hermes format and Qwen3's reasoning split, with a template that shows the tools and
    honours enable_thinking. No prefix caching: a prompt read from the cache (fp16 K/V) and one computed whole
    (f32 K/V within the chunk) can differ in a near tie, and the tests compare plain runs with streamed ones."""
    with running_server("--chat-template", str(AGENT_TEMPLATE), "--enable-auto-tool-choice", "--tool-call-parser",
                        "hermes", "--reasoning-parser", "qwen3", "--no-enable-prefix-caching",
                        "--max-model-len", "2048") as srv:  # Anthropic's thinking budget is at least 1024 tokens
        yield srv
