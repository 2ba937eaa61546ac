"""SamplingParams: how one request is decoded (vLLM's names, defaults and validation messages).

The batched sampler that applies them lives in engine/sample/sampler.py.
"""
from __future__ import annotations

import copy
import enum
import math
from dataclasses import dataclass, field
from typing import Optional, Union

import numpy as np

from cpu_kernels import envs
from engine.structured.params import StructuredOutputsParams

# Below this temperature a request is greedy (vLLM's _SAMPLING_EPS).
_SAMPLING_EPS = 1e-5
# Largest seed: what a uint64 generator state takes (-1 means "no seed").
MAX_SEED = 2**64 - 1


def max_n_sequences() -> int:
    """The largest n (vLLM's VLLM_MAX_N_SEQUENCES, same default): $RAMLM_MAX_N_SEQUENCES or 16384."""
    return envs.get("RAMLM_MAX_N_SEQUENCES")


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0   # every output carries the whole text so far
    DELTA = 1        # every output carries only what is new since the last one (streaming)
    FINAL_ONLY = 2   # one output, when the request finishes


@dataclass
class SamplingParams:
    """Sampling parameters of one request; see vLLM's SamplingParams for the long descriptions.

    n: completions to return, at most max_n_sequences() (16384 unless $RAMLM_MAX_N_SEQUENCES says otherwise).
    best_of: None or n; ramlm, like vLLM V1, does not generate extra completions to pick from.
    presence_penalty, frequency_penalty: in [-2, 2], subtracted from the logits of tokens that
        appear in the output (once, and once per occurrence).
    repetition_penalty: > 0; logits of tokens seen in the prompt or the output are divided by it
        when positive and multiplied by it when negative (1 = off).
    temperature: >= 0; below 1e-5 the request is greedy (top_p/top_k/min_p are then reset to off).
    top_p: in (0, 1]. top_k: 0 or -1 = off (normalized to 0), else keep the k most likely.
    min_p: in [0, 1]; drop tokens whose probability is below min_p times the top one's.
    seed: per-request random seed in [0, 2**64 - 1] (-1 or None = the engine's generator).
    stop: stop strings (not included in the output unless include_stop_str_in_output).
    stop_token_ids: token ids that end the request (included in token_ids, not in the text).
    ignore_eos: keep generating after EOS. max_tokens: >= 1, or None for up to the context limit.
    min_tokens: EOS and stop_token_ids are masked until this many tokens were generated.
    logprobs: how many top logprobs to return per generated token (the sampled one always comes too).
    prompt_logprobs: how many top logprobs to return per prompt token.
    logit_bias: token_id -> bias added to that token's logit before anything else.
    detokenize: produce text (False: token ids only; stop strings need it).
    output_kind: CUMULATIVE, DELTA (streaming) or FINAL_ONLY.
    structured_outputs: StructuredOutputsParams (or a dict of its fields): the output must match a JSON schema,
        a regex, a choice or a grammar (engine/structured/).
    """
    n: int = 1
    best_of: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Union[None, str, list[str]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: Optional[dict[int, float]] = None
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: Optional[StructuredOutputsParams] = None
    # Characters of text held back in streaming so that a stop string is never half-sent
    # (vLLM's output_text_buffer_length); derived, not an argument.
    output_text_buffer_length: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.best_of is None:
            self.best_of = self.n
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else [int(t) for t in self.stop_token_ids]
        if isinstance(self.seed, np.integer):
            self.seed = int(self.seed)
        if self.seed == -1:
            self.seed = None
        if self.top_k == -1:  # vLLM accepts -1 for "off" and prefers 0
            self.top_k = 0
        if self.logit_bias is not None:
            self.logit_bias = _parse_logit_bias(self.logit_bias)
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        elif self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams (or a dict of its fields), got "
                             f"{type(self.structured_outputs).__name__}.")
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:
            # Greedy: the truncation knobs cannot change the argmax, so turn them off.
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0
            self._verify_greedy_sampling()
        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = max(len(s) for s in self.stop) - 1

    def _verify_args(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool):
            raise ValueError(f"n must be an int, got {type(self.n).__name__}.")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        max_n = max_n_sequences()
        if self.n > max_n:
            raise ValueError(f"n must be at most {max_n}, got {self.n}. To increase this limit, set the "
                             "RAMLM_MAX_N_SEQUENCES environment variable.")
        if not isinstance(self.best_of, int) or isinstance(self.best_of, bool):
            raise ValueError(f"best_of must be an int, got {type(self.best_of).__name__}.")
        if self.best_of != self.n:
            raise ValueError(f"best_of must equal n (or be left out): ramlm, like vLLM V1, does not generate extra "
                             f"completions to choose from; got n={self.n} and best_of={self.best_of}.")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be -1 (no seed) or an integer in [0, 2**64 - 1], got {self.seed!r}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not math.isfinite(self.repetition_penalty):
            raise ValueError(f"repetition_penalty must be a finite number, got {self.repetition_penalty}.")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be finite, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not isinstance(self.top_k, (int, np.integer)) or isinstance(self.top_k, bool):
            raise ValueError(f"top_k must be an integer, got {type(self.top_k).__name__}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 or -1 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens}.")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be non-negative, got {self.logprobs}.")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be non-negative, got {self.prompt_logprobs}.")
        if any(not isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}.")
        if any(s == "" for s in self.stop):
            raise ValueError("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are only supported when detokenize is True. "
                             "Set detokenize=True to use stop.")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids}.")
        if self.logit_bias:
            bad = {k: v for k, v in self.logit_bias.items() if k < 0 or not math.isfinite(v)}
            if bad:
                raise ValueError(f"logit_bias needs non-negative token ids and finite biases, got {bad}.")

    def _verify_greedy_sampling(self) -> None:
        if self.n > 1:
            raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")
        if self.best_of > 1:
            raise ValueError(f"best_of must be 1 when using greedy sampling, got {self.best_of}.")

    def verify_token_ids(self, vocab_size: int) -> None:
        """Raise ValueError if logit_bias or stop_token_ids name a token outside the vocabulary, or top_k
        asks for more tokens than it has (vLLM's checks at admission)."""
        if self.top_k > vocab_size:
            raise ValueError(f"top_k cannot be greater than vocabulary size ({vocab_size}), but got {self.top_k}.")
        bad = [t for t in (self.logit_bias or {}) if t >= vocab_size]
        if bad:
            raise ValueError(f"token_id(s) {bad} in logit_bias contain out-of-vocab token ids "
                             f"(vocab_size={vocab_size}).")
        bad = [t for t in self.stop_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(f"token_id(s) {bad} in stop_token_ids are out of vocab "
                             f"(vocab_size={vocab_size}).")

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    def child_seed(self, index: int) -> Optional[int]:
        """The seed of completion `index` of n: seed + index (as vLLM does), wrapped into [0, 2**64 - 1]."""
        return None if self.seed is None else (self.seed + index) % (MAX_SEED + 1)

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)

    def make_generator(self) -> Optional[np.random.Generator]:
        """The per-request generator for a seeded request, None otherwise (the engine's is used).

        For n > 1 the engine should seed completion i with seed + i (as vLLM does).
        """
        return None if self.seed is None else np.random.default_rng(self.seed)


def _parse_logit_bias(logit_bias) -> dict[int, float]:
    """token id -> bias; JSON object keys arrive as strings."""
    out = {}
    for k, v in logit_bias.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys must be token ids (integers), got {k!r}.") from None
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"logit_bias values must be numbers, got {v!r} for token {tid}.")
        out[tid] = float(v)
    return out
