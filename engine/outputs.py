"""What the engine hands back: vLLM-shaped Logprob, CompletionOutput, RequestOutput.

Field names, order and meaning follow vLLM so that code written against `vllm.outputs` reads these
unchanged. `RequestOutput.metrics` and `num_cached_tokens` are keyword-only (vLLM takes them by
keyword in practice, and its positional order has changed between releases).
"""
from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Optional, Sequence, Union


@dataclass
class Logprob:
    """One token's log probability.

    logprob: the log probability (from the raw logits, see engine/sample/sampler.py).
    rank: 1-based rank of the token in the distribution (1 = most likely), None if unknown.
    decoded_token: the token's text; the engine fills it (the sampler leaves None).
    """
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# One dict per generated token: token_id -> Logprob (the sampled token plus the top-k).
SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt token; entry 0 is None (nothing predicts the first token).
PromptLogprobs = list[Optional[dict[int, Logprob]]]


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (time.time()) of a request's life; None until the event happens."""
    arrival_time: float
    last_token_time: Optional[float] = None
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    time_in_queue: Optional[float] = None
    finished_time: Optional[float] = None


@dataclass
class CompletionOutput:
    """One completion (of the n a request asked for).

    index: which of the n completions this is.
    text: the generated text (the whole of it, or only the new part for DELTA output).
    token_ids: the generated token ids.
    cumulative_logprob: sum of the sampled tokens' logprobs; None when logprobs were not requested.
    logprobs: per generated token, token_id -> Logprob; None when not requested.
    finish_reason: None while running, then "stop" (EOS, stop token or stop string) or "length"
        (max_tokens or context limit) or "abort".
    stop_reason: the stop string or stop token id that ended it; None for EOS or length.
    """
    index: int
    text: str
    token_ids: Sequence[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    lora_request: None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request after a step (or at the end for LLM.generate).

    request_id: the request's id.
    prompt: the prompt text (None if the request came as token ids).
    prompt_token_ids: the prompt's token ids.
    prompt_logprobs: per prompt token, token_id -> Logprob (entry 0 None); None when not requested.
    outputs: one CompletionOutput per completion (n of them).
    finished: whether every completion has finished.
    metrics: timestamps, see RequestMetrics (keyword-only).
    num_cached_tokens: prompt tokens served from the prefix cache (keyword-only).
    """
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[list[int]]
    prompt_logprobs: Optional[PromptLogprobs]
    outputs: list[CompletionOutput]
    finished: bool
    _: KW_ONLY
    metrics: Optional[RequestMetrics] = None
    num_cached_tokens: Optional[int] = None
    lora_request: None = None
    encoder_prompt: Optional[str] = None
    encoder_prompt_token_ids: Optional[list[int]] = None
    kv_transfer_params: Optional[dict] = field(default=None, repr=False)
    pooled: Optional[Any] = field(default=None, repr=False)  # a pooling request's vector (np.ndarray float32)

    def add(self, next_output: "RequestOutput", aggregate: bool) -> None:
        """Merge a later output of the same request into this one (as vLLM does for n > 1 streams).

        aggregate=True appends the new text/tokens/logprobs (DELTA outputs accumulated into one);
        aggregate=False replaces each completion by its newer version.
        """
        self.finished |= next_output.finished
        self.kv_transfer_params = next_output.kv_transfer_params
        if next_output.num_cached_tokens is not None:
            self.num_cached_tokens = next_output.num_cached_tokens
        for next_completion in next_output.outputs:
            for i, completion in enumerate(self.outputs):
                if completion.index != next_completion.index:
                    continue
                if aggregate:
                    completion.text += next_completion.text
                    if not isinstance(completion.token_ids, list):
                        completion.token_ids = list(completion.token_ids)
                    completion.token_ids.extend(next_completion.token_ids)
                    if next_completion.logprobs:
                        if completion.logprobs is None:
                            completion.logprobs = []
                        completion.logprobs.extend(next_completion.logprobs)
                    completion.cumulative_logprob = next_completion.cumulative_logprob
                    completion.finish_reason = next_completion.finish_reason
                    completion.stop_reason = next_completion.stop_reason
                else:
                    self.outputs[i] = next_completion
                break
            else:
                self.outputs.append(next_completion)


@dataclass
class EmbeddingOutput:
    """vLLM's: one embedding."""
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """vLLM's: what LLM.embed returns per prompt."""
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class PoolingOutput:
    """vLLM's: the pooled data (a torch tensor, as vLLM's)."""
    data: Any


@dataclass
class PoolingRequestOutput:
    """vLLM's: what LLM.encode returns per prompt."""
    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class ScoringOutput:
    """vLLM's: one pair's score."""
    score: float


@dataclass
class ScoringRequestOutput:
    """vLLM's: what LLM.score returns per pair."""
    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class ClassificationOutput:
    """vLLM's: the class probabilities."""
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput:
    """vLLM's: what LLM.classify returns per prompt."""
    request_id: str
    outputs: ClassificationOutput
    prompt_token_ids: list[int]
    finished: bool = True
