"""`ramlm chat` with piped stdin, and through a pseudo-terminal (prompt, Ctrl-C mid-reply, /exit)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.engine.entrypoints.server.conftest import REPO

BASE = [sys.executable, "-m", "engine.entrypoints.cli", "chat", "--max-model-len", "256", "--kv-cache-memory", "0.1",
        "--temperature", "0"]


def test_chat_with_piped_stdin():
    # Two user turns; /help, a blank line, /reset and an unknown command are not sent; /exit ends the
    # session before "Three".
    lines = "Hello\n/help\n\n/reset\nWhat is two plus two?\n/bogus\n/exit\nThree\n"
    p = subprocess.run(BASE + ["--max-tokens", "6", "--ignore-eos", "--system", "Be brief."], input=lines,
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    stats = [ln for ln in p.stderr.splitlines() if ln.startswith("[6 tokens in ") and "tok/s]" in ln]
    assert len(stats) == 2, p.stderr
    assert "[conversation reset]" in p.stderr and "/reset" in p.stderr  # /help printed the commands
    assert "unknown command /bogus" in p.stderr
    assert ">>>" not in p.stdout and "ramlm chat:" not in p.stderr  # no decoration when piped
    assert p.stdout.count("\n") >= 2 and p.stdout.strip()


class _Pty:
    """A child process on a pseudo-terminal; read() collects output until a pattern shows."""

    def __init__(self, argv: list[str]):
        import pty
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child
            os.chdir(REPO)
            # As a terminal's shell starts a foreground job: Ctrl-C's default action (a test run started in the
            # background by a non-interactive shell ignores SIGINT, and exec keeps an ignored signal ignored).
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(argv[0], argv)
        self.buf = b""

    def read_until(self, pattern: bytes, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while pattern not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} in {timeout} s; got:\n{self.buf[-2000:]!r}")
            r, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if r:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the program ended before {pattern!r}:\n{self.buf[-2000:]!r}")
                self.buf += chunk
        i = self.buf.index(pattern) + len(pattern)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:  # keep draining so the child never blocks on a full terminal
                if select.select([self.fd], [], [], 0.1)[0]:
                    self.buf += os.read(self.fd, 4096)
            except OSError:
                pass
        self.kill()
        raise AssertionError("the program did not exit")

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pty test written for Linux")
def test_chat_in_a_terminal_ctrl_c_stops_the_reply_not_the_program():
    term = _Pty(BASE + ["--max-tokens", "200", "--ignore-eos"])
    try:
        term.read_until(b">>> ", timeout=300)
        term.send(b"Tell me a long story.\r")
        term.read_until(b"Tell me a long story.", timeout=10)  # the echo
        # Wait for some reply text, then interrupt.
        deadline = time.monotonic() + 120
        while len(term.buf.strip()) < 5 and time.monotonic() < deadline:
            r, _, _ = select.select([term.fd], [], [], 0.2)
            if r:
                term.buf += os.read(term.fd, 4096)
        term.send(b"\x03")
        stats = term.read_until(b"tok/s", timeout=60) + term.read_until(b"]", timeout=5)
        assert b"(interrupted)" in stats and b"[200 tokens" not in stats
        term.read_until(b">>> ", timeout=30)
        time.sleep(0.5)  # let input() start reading
        term.send(b"\x03")  # Ctrl-C at the prompt: a fresh prompt, not an exit
        term.read_until(b">>> ", timeout=30)
        term.send(b"/exit\r")
        assert term.wait(timeout=30) == 0
    finally:
        term.kill()


def test_chat_session_keeps_history_and_resets():
    """In-process, over the fake engine of test_async_engine (no model)."""
    import io
    from types import SimpleNamespace

    from engine.entrypoints.chat_cli import ChatSession
    from engine.entrypoints.cli import build_parser
    from tests.engine.entrypoints.server.test_async_engine import FakeEngine

    fake = FakeEngine()
    llm = SimpleNamespace(llm_engine=fake, get_tokenizer=lambda: fake.tokenizer)
    ns = build_parser().parse_args(["chat", "--system", "Be brief.", "--max-tokens", "3", "--temperature", "0"])
    out, err = io.StringIO(), io.StringIO()
    s = ChatSession(llm, ns, out=out, err=err)
    assert s.reply("one") and s.reply("two")
    assert [m["role"] for m in s.messages()] == ["system", "user", "assistant", "user", "assistant"]
    assert s.messages()[2]["content"] == "abc" and out.getvalue() == "abc\nabc\n"
    assert err.getvalue().count("[3 tokens in ") == 2
    assert s.command("/reset") and s.messages() == [{"role": "system", "content": "Be brief."}]
    assert not s.reply("x" * 100)  # longer than the fake's context: refused, history unchanged
    assert s.history == [] and "fills the context" in err.getvalue()
    assert not s.command("/exit")
