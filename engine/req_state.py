"""The engine's per-request bookkeeping beside the scheduler's Request: sampling, text, logprobs."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from engine.tokenization.detokenizer import IncrementalDetokenizer, fill_decoded_tokens
from engine.outputs import CompletionOutput, Logprob, RequestMetrics
from engine.core.request import Request
from engine.sample.sampling import SamplingParams


@dataclass
class ChildState:
    """One of a request's n completions; it runs as its own scheduler Request.

    Once finished it is released: only its CompletionOutput stays (with a large n, the finished
    completions must not each keep a Request with copies of the prompt, a detokenizer and a generator).
    """
    request: Optional[Request]  # None once released
    params: SamplingParams
    index: int
    detok: Optional[IncrementalDetokenizer]
    generator: Optional[np.random.Generator]
    logprobs: Optional[list[dict[int, Logprob]]] = None
    cumulative_logprob: float = 0.0
    prompt_logprobs: Optional[list] = None  # only child 0 computes them
    finish_reason: Optional[str] = None
    stop_reason: object = None
    final: Optional[CompletionOutput] = None  # set by release()
    grammar: Optional[Any] = None  # structured outputs: the completion's matcher (engine/structured/backends.py)
    pooling: Optional[Any] = None  # a pooling request's running pool (engine/pooling/pooler.py)
    embedding: Optional[np.ndarray] = None  # ... and the vector it ended with
    request_id: str = field(init=False)
    num_cached_tokens: int = field(init=False, default=0)  # kept from the Request at release

    def __post_init__(self) -> None:
        self.request_id = self.request.request_id

    def completion(self) -> CompletionOutput:
        if self.final is not None:
            return self.final
        return CompletionOutput(
            index=self.index, text=self.detok.get_next_output_text(self.finish_reason is not None, delta=False),
            token_ids=list(self.request.output_token_ids),
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=self.logprobs, finish_reason=self.finish_reason, stop_reason=self.stop_reason)

    def add_logprobs(self, tokenizer, tokens: list[int], logprobs: list) -> None:
        """The logprob entries of new output tokens (when the completion asked for logprobs)."""
        if self.logprobs is not None:
            fill_decoded_tokens(tokenizer, logprobs)
            self.logprobs.extend(logprobs)
            self.cumulative_logprob += sum(lp[t].logprob for t, lp in zip(tokens, logprobs))

    def drop_logprobs(self, tokens: list[int]) -> None:
        """Takes back the logprobs of the last `tokens`: accepted drafts that a stop cut from the output."""
        if self.logprobs is not None and tokens:
            self.cumulative_logprob -= sum(lp[t].logprob for t, lp in zip(tokens, self.logprobs[-len(tokens):]))
            del self.logprobs[-len(tokens):]

    def release(self) -> None:
        """A finished completion keeps its output only."""
        self.final = self.completion()
        self.num_cached_tokens = self.request.num_cached_tokens
        self.request = self.detok = self.generator = self.grammar = self.pooling = None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens its first schedule found in the prefix cache."""
        return self.request.num_cached_tokens if self.request is not None else self.num_cached_tokens


@dataclass
class ParentState:
    """A user request: its prompt and its n children."""
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.time)
    children: list[ChildState] = field(default_factory=list)
    first_token_time: Optional[float] = None
    first_scheduled_time: Optional[float] = None
    grammar: Optional[tuple[str, Any]] = None  # structured outputs: (backend, compiled grammar) its children match
    pooling_params: Optional[Any] = None  # a pooling request's PoolingParams (params is then the engine's own)
    lora_request: Optional[Any] = None  # its LoRA adapter (lora.LoRARequest), if any
    token_type_ids: tuple[int, ...] = ()  # each prompt token's type (BERT's segments); () = all type 0

    @property
    def num_pending_children(self) -> int:
        """Completions not created yet: the engine creates them as the scheduler has room (a cheap fan-out)."""
        return self.params.n - len(self.children)

    @property
    def finished(self) -> bool:
        return self.num_pending_children == 0 and all(c.finish_reason is not None for c in self.children)

    def metrics(self) -> RequestMetrics:
        done = self.finished
        return RequestMetrics(arrival_time=self.arrival_time, first_scheduled_time=self.first_scheduled_time,
                              first_token_time=self.first_token_time,
                              time_in_queue=(self.first_scheduled_time - self.arrival_time
                                             if self.first_scheduled_time else None),
                              finished_time=time.time() if done else None, last_token_time=time.time())
