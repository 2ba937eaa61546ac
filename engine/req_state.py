"""The engine's per-request bookkeeping beside the scheduler's Request: sampling, text, logprobs."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from engine.tokenization.detokenizer import IncrementalDetokenizer
from engine.outputs import CompletionOutput, Logprob, RequestMetrics
from engine.core.request import Request
from engine.sample.sampling import SamplingParams


@dataclass
class ChildState:
    """One of a request's n completions; it runs as its own scheduler Request."""
    request: Request
    params: SamplingParams
    index: int
    detok: IncrementalDetokenizer
    generator: Optional[np.random.Generator]
    logprobs: Optional[list[dict[int, Logprob]]] = None
    cumulative_logprob: float = 0.0
    prompt_logprobs: Optional[list] = None  # only child 0 computes them
    finish_reason: Optional[str] = None
    stop_reason: object = None

    def completion(self) -> CompletionOutput:
        return CompletionOutput(
            index=self.index, text=self.detok.get_next_output_text(self.finish_reason is not None, delta=False),
            token_ids=list(self.request.output_token_ids),
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=self.logprobs, finish_reason=self.finish_reason, stop_reason=self.stop_reason)


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

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.children)

    def metrics(self) -> RequestMetrics:
        done = self.finished
        return RequestMetrics(arrival_time=self.arrival_time, first_scheduled_time=self.first_scheduled_time,
                              first_token_time=self.first_token_time,
                              time_in_queue=(self.first_scheduled_time - self.arrival_time
                                             if self.first_scheduled_time else None),
                              finished_time=time.time() if done else None, last_token_time=time.time())
