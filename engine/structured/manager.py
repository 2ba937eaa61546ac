"""The engine's structured outputs: which backend takes a request (--structured-outputs-backend auto|xgrammar|guidance;
auto: xgrammar, and guidance for what xgrammar refuses, as vLLM picks), the compile cache, and each step's mask.

Grammars compile on a worker thread, cached by what they depend on (StructuredOutputsParams.key), so the step loop
never waits for one: the engine admits a request once its grammar is ready (LLMEngine._admit_ready). Each step fills
one bitmask for all constrained rows, unpacks it once and masks their logits before the sampler.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import numpy as np

from cpu_kernels.token_mask import apply_token_bitmask
from engine.structured.backends import GuidanceBackend, XgrammarBackend
from engine.structured.params import BACKENDS, StructuredOutputsParams
from engine.structured.reasoning_gate import AfterReasoning

CACHE_SIZE = 256  # compiled grammars kept (LRU)
_CLASSES = {"xgrammar": XgrammarBackend, "guidance": GuidanceBackend}


class StructuredOutputs:
    def __init__(self, tokenizer, vocab_size: int, backend: str = "auto"):
        if backend not in BACKENDS:
            raise ValueError(f"structured_outputs_backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.tokenizer, self.vocab_size, self.default = tokenizer, vocab_size, backend
        self._backends: dict = {}
        self._build_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple, Future] = OrderedDict()
        self._chosen: OrderedDict[tuple, str] = OrderedDict()  # params key -> the backend that takes it
        self._pool = None

    def backend(self, name: str):
        """The named backend, built on first use (xgrammar ~0.2 s, guidance's tokenizer ~2 s for 262k tokens) under
        its own lock, so that building one never holds up the other."""
        with self._lock:
            if name in self._backends:
                return self._backends[name]
            build_lock = self._build_locks.setdefault(name, threading.Lock())
        with build_lock:
            if name not in self._backends:
                built = _CLASSES[name](self.tokenizer, self.vocab_size)
                with self._lock:
                    self._backends[name] = built
        return self._backends[name]

    def check(self, p: StructuredOutputsParams) -> str:
        """The backend that takes p; ValueError naming the problem when none does (whatever a library raised)."""
        try:
            return self._check(p)
        except ValueError:
            raise
        except Exception as e:  # RecursionError of a deeply nested schema, a library's own types: the request's
            raise ValueError(f"structured_outputs.{p.kind}: {type(e).__name__}: {e}") from None

    def _check(self, p: StructuredOutputsParams) -> str:
        key = (*p.key(), p.disable_fallback)
        with self._lock:
            if key in self._chosen:
                return self._chosen[key]
        if self.default != "auto":
            self.backend(self.default).check(p)
            name = self.default
        else:
            try:
                self.backend("xgrammar").check(p)
                name = "xgrammar"
            except ValueError as first:
                if p.disable_fallback:
                    raise
                try:
                    self.backend("guidance").check(p)
                except ValueError:
                    raise first from None
                name = "guidance"
        with self._lock:
            self._chosen[key] = name
            while len(self._chosen) > CACHE_SIZE:
                self._chosen.popitem(last=False)
        return name

    def compile(self, p: StructuredOutputsParams) -> Future:
        """The compiled grammar of p, compiling on the worker thread unless cached."""
        name = self.check(p)
        key, backend = (name, *p.key()), self.backend(name)
        with self._lock:
            fut = self._cache.get(key)
            if fut is not None and not (fut.done() and fut.exception() is not None):
                self._cache.move_to_end(key)
                return fut
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="ramlm-grammar")
            fut = self._pool.submit(backend.compile, p)
            self._cache[key] = fut
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return fut

    def matcher(self, backend: str, compiled, params: Optional[StructuredOutputsParams] = None):
        """A fresh matcher for one completion over a grammar `backend` compiled (what compile's future gave); with
        params whose _reasoning_end is set (the server's reasoning parser), one that starts after the reasoning."""
        matcher = self.backend(backend).matcher(compiled)
        if params is not None and params._reasoning_end:
            return AfterReasoning(matcher, params._reasoning_end,
                                  lambda t: self.tokenizer.decode([t], skip_special_tokens=False))
        return matcher

    def mask(self, logits: np.ndarray, rows: list[int], matchers: list) -> list:
        """Sets the logits of tokens the grammars refuse to -inf, rows[j] by matchers[j]; per row, whether any token
        is left (a grammar that accepts nothing more ends its request), or the exception its matcher raised (that
        row is masked whole). logits: f32 (R, V) C-contiguous, changed in place."""
        if not rows:
            return []
        bitmask = np.zeros((len(rows), (logits.shape[1] + 31) // 32), np.int32)
        errors: list = [None] * len(rows)
        for j, m in enumerate(matchers):
            try:
                m.fill(bitmask, j)
            except Exception as e:
                bitmask[j] = 0
                errors[j] = e
        allowed = apply_token_bitmask(logits, np.asarray(rows, np.int64), bitmask).tolist()
        return [e if e is not None else ok for e, ok in zip(errors, allowed)]
