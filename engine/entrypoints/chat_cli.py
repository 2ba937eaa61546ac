"""`ramlm chat`: an interactive chat in the terminal, the engine in-process (no server).

The conversation goes through the model's chat template; tokens stream as they come; tokens/s go
to stderr after each reply. Ctrl-C stops the current reply (the partial reply stays in the history)
and not the program; Ctrl-D or /exit ends it. With piped stdin every line is one user turn, read
until EOF, and stdout carries only the replies (one per line block).
"""
from __future__ import annotations

import argparse
import signal
import sys
import time

HELP = """commands:
  /reset          forget the conversation (the system prompt stays)
  /system [TEXT]  show or set the system prompt (and reset)
  /exit, /quit    leave (Ctrl-D too)
  /help           this text
Ctrl-C stops the current reply."""


def add_chat_args(p: argparse.ArgumentParser) -> None:
    from engine.args import EngineArgs
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL", help="same as --model")
    from engine.entrypoints.sampling_args import add_sampling_args
    p.add_argument("--system", default=None, help="system prompt")
    add_sampling_args(p, max_tokens=512, temperature=0.7, top_p=0.95)  # max_tokens: per reply
    EngineArgs.add_cli_args(p)


class _Interrupt:
    """While active, SIGINT sets a flag (checked between engine steps) instead of raising mid-step."""

    def __init__(self):
        self.hit = False
        self._old = None

    def __enter__(self):
        self.hit = False
        try:
            self._old = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread
            self._old = None
        return self

    def _handler(self, signum, frame):
        self.hit = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        return False


class ChatSession:
    def __init__(self, llm, ns: argparse.Namespace, out=None, err=None):
        self.llm = llm
        self.engine = llm.llm_engine
        self.tokenizer = llm.get_tokenizer()
        self.ns = ns
        self.system = ns.system
        self.history: list[dict] = []
        self.out, self.err = out or sys.stdout, err or sys.stderr

    def messages(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.history

    def reply(self, user_text: str) -> bool:
        """Streams the reply to user_text; returns False if it could not run (history unchanged)."""
        from engine.entrypoints.sampling_args import sampling_params_from
        self.history.append({"role": "user", "content": user_text})
        try:
            ids = self.tokenizer.apply_chat_template(self.messages(), add_generation_prompt=True, tokenize=True)
        except Exception as e:
            self.history.pop()
            print(f"[error: the chat template failed: {e}]", file=self.err)
            return False
        room = self.engine.max_model_len - len(ids)
        if room < 1:
            self.history.pop()
            print(f"[the conversation ({len(ids)} tokens) fills the context ({self.engine.max_model_len}); "
                  f"/reset to start over]", file=self.err)
            return False
        try:
            params = sampling_params_from(self.ns, max_tokens=min(self.ns.max_tokens, room))
            rid = self.engine.add_request(None, {"prompt_token_ids": ids}, params)
        except ValueError as e:
            self.history.pop()
            print(f"[error: {e}]", file=self.err)
            return False
        text, n, done, first = "", 0, False, None
        t0 = time.perf_counter()
        with _Interrupt() as stop:
            try:
                while not done and not stop.hit:
                    for o in self.engine.step():
                        if o.request_id != rid:
                            continue
                        c = o.outputs[0]
                        if first is None and c.token_ids:
                            first = time.perf_counter()
                        self.out.write(c.text[len(text):])
                        self.out.flush()
                        text, n, done = c.text, len(c.token_ids), o.finished
            finally:
                self.engine.abort_request(rid)
        elapsed = time.perf_counter() - t0
        self.out.write("\n")
        self.out.flush()
        self.history.append({"role": "assistant", "content": text})
        decode_s = time.perf_counter() - first if first else 0.0
        rate = (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0
        note = " (interrupted)" if stop.hit and not done else ""
        print(f"[{n} tokens in {elapsed:.2f} s, {rate:.1f} tok/s{note}]", file=self.err, flush=True)
        return True

    def command(self, line: str) -> bool:
        """Handles a /command; returns False to leave."""
        cmd, _, rest = line.partition(" ")
        cmd = cmd.lower()
        if cmd in ("/exit", "/quit", "/bye"):
            return False
        if cmd == "/reset":
            self.history.clear()
            print("[conversation reset]", file=self.err)
        elif cmd == "/system":
            if rest.strip():
                self.system = rest.strip()
                self.history.clear()
                print("[system prompt set; conversation reset]", file=self.err)
            else:
                print(f"[system prompt: {self.system!r}]", file=self.err)
        elif cmd in ("/help", "/?"):
            print(HELP, file=self.err)
        else:
            print(f"[unknown command {cmd}; /help lists them]", file=self.err)
        return True


def run_chat(ns: argparse.Namespace, stdin=None) -> int:
    from engine import LLM
    from engine.args import EngineArgs
    if ns.model_tag is not None:
        ns.model = ns.model_tag
    from engine.entrypoints.sampling_args import sampling_params_from
    stdin = stdin or sys.stdin
    interactive = stdin.isatty()
    engine_args = EngineArgs.from_cli_args(ns)
    sampling_params_from(ns)  # a bad value fails before the model loads
    llm = LLM(**vars(engine_args))
    session = ChatSession(llm, ns)
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        print(f"ramlm chat: {llm.model_path}; /help for commands, Ctrl-D to leave", file=sys.stderr)
    while True:
        try:
            if interactive:
                line = input(">>> ")
            else:
                line = stdin.readline()
                if not line:
                    break
        except EOFError:
            if interactive:
                print(file=sys.stderr)
            break
        except KeyboardInterrupt:  # at the prompt: a fresh line, like a shell
            print("^C" if interactive else "", file=sys.stderr)
            if not interactive:
                break
            continue
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        if line.startswith("/"):
            if not session.command(line.strip()):
                break
            continue
        session.reply(line)
    return 0
