"""Chat templates rendered in worker processes, each render with a time limit.

A Jinja template can loop for minutes (nested loops over range(), even in the sandbox), and a thread
cannot be stopped, so rendering runs in a child process: one that passes the limit is killed and replaced.
The event loop only waits on a pipe meanwhile. Workers are plain subprocesses
(`python -m engine.entrypoints.server.template_worker`) speaking length-prefixed JSON on stdin/stdout,
so they work whatever the server's main module is, and they get an address-space limit.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from engine.entrypoints.server.limits import CHAT_TEMPLATE_TIMEOUT_S

logger = logging.getLogger("ramlm.server")
DEFAULT_NUM_WORKERS = 2
MEMORY_LIMIT_BYTES = 2**30  # a worker's address space; an idle one uses about 30 MB
_HEADER = struct.Struct("!I")  # frame length


class TemplateError(ValueError):
    """The template raised (roles that do not alternate, a bad kwarg, ...) or ran past the time limit."""


class _Worker:
    def __init__(self):
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[3])  # the folder holding the engine package
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen([sys.executable, "-m", "engine.entrypoints.server.template_worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def render(self, job: list, timeout_s: float) -> tuple[bool, str]:
        """Blocking; raises TimeoutError (the worker is then killed) or EOFError (it died)."""
        deadline = time.monotonic() + timeout_s
        try:
            _write_frame(self.process.stdin, job)
        except (BrokenPipeError, OSError):
            raise EOFError from None
        header = self._read(_HEADER.size, deadline)
        ok, text = json.loads(self._read(_HEADER.unpack(header)[0], deadline))
        return ok, text

    def _read(self, n: int, deadline: float) -> bytes:
        fd, data = self.process.stdout.fileno(), b""
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                raise TimeoutError
            part = os.read(fd, n - len(data))
            if not part:
                raise EOFError
            data += part
        return data

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(5)
        self.process.stdin.close()
        self.process.stdout.close()


class TemplateRenderer:
    """Renders chat templates in up to `num_workers` child processes.

    Args:
        timeout_s: a render that takes longer fails with TemplateError; its worker is killed.
        num_workers: renders that run at once; more wait for a free worker.
    """

    def __init__(self, timeout_s: float = CHAT_TEMPLATE_TIMEOUT_S, num_workers: int = DEFAULT_NUM_WORKERS):
        if not timeout_s > 0:
            raise ValueError(f"the chat template timeout must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.num_workers = num_workers
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots: Optional[asyncio.Semaphore] = None

    def start(self) -> None:
        """Starts the workers now rather than at the first chat (each takes about 0.1 s)."""
        workers = [_Worker() for _ in range(self.num_workers)]
        with self._lock:
            self._idle.extend(workers)

    def close(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
        for w in workers:
            w.kill()

    async def render(self, source: str, messages: list[dict], **kwargs: Any) -> str:
        """chat_templates.render(source, messages, **kwargs) in a worker (all arguments JSON values).

        Raises:
            TemplateError: the template raised, ran past timeout_s, or killed its worker.
        """
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.num_workers)
        async with self._slots:
            return await asyncio.to_thread(self._render_blocking, [source, messages, kwargs])

    def _render_blocking(self, job: list) -> str:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None or worker.process.poll() is not None:  # none idle, or it died since
            worker = _Worker()
        try:
            ok, value = worker.render(job, self.timeout_s)
        except TimeoutError:
            logger.warning("a chat template ran past %g s; its worker was killed", self.timeout_s)
            raise TemplateError(f"the chat template did not finish rendering within {self.timeout_s:g} s") from None
        except (EOFError, ValueError):
            worker.kill()
            logger.warning("a chat template worker died while rendering")
            raise TemplateError("the chat template could not be rendered (its worker process died)") from None
        with self._lock:
            self._idle.append(worker)
        if not ok:
            raise TemplateError(value)
        return value


def _write_frame(stream, value: Any) -> None:
    data = json.dumps(value, ensure_ascii=False).encode("utf-8")
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_frame(stream) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    return json.loads(stream.read(_HEADER.unpack(header)[0]))


def main() -> None:
    """The worker: [source, messages, kwargs] frames in, [ok, text or error message] frames out."""
    try:
        import resource  # a template that builds gigabytes of text gets a MemoryError, not the host's RAM
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    except (ImportError, ValueError, OSError):  # no such limit on this platform
        pass
    from engine.tokenization import chat_templates
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            source, messages, kwargs = _read_frame(stdin)
        except EOFError:
            return
        try:
            result = [True, chat_templates.render(source, messages, **kwargs)]
        except Exception as e:  # the template's own error, as text
            result = [False, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__]
        _write_frame(stdout, result)


if __name__ == "__main__":
    main()
