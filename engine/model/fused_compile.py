"""block_step's signatures (one per combination of a model's weight formats) compiled off the critical path.

A signature takes ~10 s to compile (the block's kernels are optimized again inside it): compiled at the engine's
warm-up on a fresh cache it put the first token at 68 s (38 s without), and compiled on a thread from the warm-up
on it still cost 10-14 s (the main thread's own compiles after the warm-up waited for Numba's compiler lock). So
a signature first seen is only noted; the engine starts its compile on a background thread once a request has
sampled a token (start_pending), and the blocks run their kernels one by one until it is ready. A marker file in
the JIT cache folder then says it is cached, and later processes load it at once (the engine's warm-up). Exit
waits for a compile under way, so that its machine code reaches the cache. RAMLM_FUSED_COMPILE picks `inline` (at
the first step) or `cached` (never compile: short runs such as the test suite, whose models are many) instead."""
from __future__ import annotations

import atexit
import hashlib
import os
import threading

from cpu_kernels import CACHE_DIR, envs
from cpu_kernels.decode_block import block_step

_state: dict[str, str] = {}  # signature key -> "wanted", "compiling", "ready", "failed" or "uncached"
_wanted: dict[str, tuple] = {}  # signatures noted, not compiling yet
_threads: list[threading.Thread] = []  # compiles started (wait() joins them)


def signature(args) -> tuple:
    """block_step's Numba signature for these arguments."""
    return tuple(block_step.typeof_pyval(a) for a in args)


def ready(sig: tuple) -> bool:
    """Whether block_step runs sig now: cached ones load; uncached ones are noted for start_pending (False)."""
    key = hashlib.sha256(str(sig).encode()).hexdigest()[:16]
    state, mode = _state.get(key), envs.get("RAMLM_FUSED_COMPILE")
    if state == "compiling" and mode == "inline":  # in line means now: join the compile an earlier engine started
        wait()
        state = _state.get(key)
    if state == "uncached" and mode != "cached":  # the mode changed since (tests)
        state = None
    if state in ("ready", "compiling", "failed", "uncached"):
        return state == "ready"
    if mode == "inline" or os.path.exists(_marker(key)):  # a noted signature too, once it may compile in line
        _wanted.pop(key, None)
        _compile(key, sig)  # a cached signature: a load of ~20 ms
        return _state[key] == "ready"
    if mode == "cached":
        _state[key] = "uncached"  # kernel by kernel for this process's lifetime
        return False
    _state[key] = "wanted"
    _wanted[key] = sig
    return False


def pending() -> bool:
    """Whether signatures wait for start_pending."""
    return bool(_wanted)


def start_pending() -> None:
    """Starts compiling, on one background thread, the signatures noted so far."""
    if not _wanted:
        return
    todo = list(_wanted.items())
    _wanted.clear()
    thread = threading.Thread(target=lambda: [_compile(k, s) for k, s in todo], name="ramlm-fused-compile",
                              daemon=True)
    for key, _ in todo:
        _state[key] = "compiling"
    _threads.append(thread)
    thread.start()
    atexit.register(thread.join)


def wait() -> None:
    """Blocks until every compile under way has finished."""
    for thread in list(_threads):
        thread.join()


def _marker(key: str) -> str:
    return os.path.join(CACHE_DIR, f"fused-block-{key}")


def _compile(key: str, sig: tuple) -> None:
    try:
        block_step.compile(sig)
    except Exception:  # the blocks keep running their kernels one by one
        _state[key] = "failed"
        return
    try:
        os.makedirs(CACHE_DIR, exist_ok=True)
        with open(_marker(key), "w"):
            pass
    except OSError:
        pass
    _state[key] = "ready"
