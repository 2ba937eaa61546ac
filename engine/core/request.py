"""One request's state inside the engine: its tokens, how far its KV is computed, its status and blocks.

Plain Python only (no arrays): the scheduler and the KV-cache manager read and update it.
"""
from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from numbers import Integral
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # blocks freed; waits at the front of the queue to be recomputed
    FINISHED_STOPPED = "finished_stopped"  # EOS, a stop token, or a stop string (reported by the detokenizer)
    FINISHED_LENGTH_CAPPED = "finished_length_capped"  # max_tokens or max_model_len
    FINISHED_ABORTED = "finished_aborted"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED

    @staticmethod
    def from_finish_reason(reason: FinishReason) -> RequestStatus:
        try:
            return _REASON_TO_STATUS[reason]
        except KeyError:
            raise ValueError(f"unknown finish reason {reason!r}; expected 'stop', 'length' or 'abort'") from None


_FINISHED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED,
                       RequestStatus.FINISHED_ABORTED})
_REASON_TO_STATUS = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH_CAPPED,
                     "abort": RequestStatus.FINISHED_ABORTED}
_STATUS_TO_REASON = {v: k for k, v in _REASON_TO_STATUS.items()}


class Request:
    """A generation request.

    Args:
        request_id: unique among live requests.
        prompt_token_ids: the prompt, already tokenized (non-empty).
        sampling_params: duck typed; read attributes: max_tokens (None = up to max_model_len),
            min_tokens, ignore_eos, stop_token_ids, and optionally prompt_logprobs (not None disables
            the prefix-cache lookup, since those positions must be computed).
        arrival_time: time.monotonic() seconds; defaults to now.
        eos_token_ids: the model's end-of-sequence ids (one int or several).
        max_model_len: context limit; the scheduler sets it at add_request when left None.
        cache_salt: optional string mixed into the first block hash, so that different tenants
            never share prefix-cache blocks.
        lora_id, lora_name: the request's LoRA adapter (0: none; lora_name: what identifies its weights, its
            name and path); the scheduler runs at most max_loras adapters in a step, and the adapter is mixed
            into the first block hash (its KV differs).
    """

    def __init__(self, request_id: str, prompt_token_ids: Iterable[int], sampling_params: Any,
                 arrival_time: float | None = None, eos_token_ids: int | Iterable[int] | None = None,
                 max_model_len: int | None = None, cache_salt: str | None = None, lora_id: int = 0,
                 lora_name: str | None = None):
        self.request_id = request_id
        self.prompt_token_ids: list[int] = [int(t) for t in prompt_token_ids]
        if not self.prompt_token_ids:
            raise ValueError(f"request {request_id!r}: empty prompt")
        self.sampling_params = sampling_params
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        if eos_token_ids is None:
            eos_token_ids = ()
        elif isinstance(eos_token_ids, Integral):
            eos_token_ids = (eos_token_ids,)
        self.eos_token_ids: tuple[int, ...] = tuple(int(t) for t in eos_token_ids)
        self.cache_salt = cache_salt
        self.lora_id, self.lora_name = lora_id, lora_name
        self.skip_prefix_cache = False  # computes every prompt position (a pooled request reads them all)

        sp = sampling_params
        self.min_tokens: int = int(getattr(sp, "min_tokens", 0) or 0)
        self.ignore_eos: bool = bool(getattr(sp, "ignore_eos", False))
        self.stop_token_ids: frozenset[int] = frozenset(getattr(sp, "stop_token_ids", None) or ())
        requested = getattr(sp, "max_tokens", None)
        if requested is not None and requested < 1:
            raise ValueError(f"request {request_id!r}: max_tokens must be at least 1, got {requested}")
        self._requested_max_tokens: int | None = requested
        self.max_model_len: int | None = None
        self.max_tokens: int = 0  # set by set_max_model_len
        if max_model_len is not None:
            self.set_max_model_len(max_model_len)

        self.output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0  # tokens whose KV is (or is being, this step) written
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None  # the stop token id (or stop string) that ended it
        # Owned by the KV-cache manager: this request's block table per cache group, and chain hashes of its full
        # blocks.
        self.block_tables: list[list[int]] = [[]]
        self.block_hashes: list[bytes] = []
        # Models with linear-attention layers (engine/core/hybrid_cache.py): the slot of its live state (-1: none),
        # and this step's snapshot (rows of the step before a block boundary, checkpoint slot) or ().
        self.state_slot = -1
        self.state_snapshot: tuple[int, int] | tuple[()] = ()
        self.num_cached_tokens = 0  # prefix-cache hit tokens at the first schedule
        # Speculative decoding: tokens proposed after the last sampled one, checked by the next step (the engine
        # sets them; the scheduler runs them with it and takes back the KV of those rejected).
        self.spec_token_ids: list[int] = []
        self.num_preemptions = 0
        # Timestamps (time.monotonic()).
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None

    @property
    def hash_extra_keys(self) -> tuple:
        """What the first block's hash mixes in besides its tokens: the cache salt, the LoRA adapter."""
        keys = () if self.cache_salt is None else (self.cache_salt,)
        return keys + ((f"lora:{self.lora_id}:{self.lora_name}",) if self.lora_id else ())

    @property
    def block_ids(self) -> list[int]:
        """Group 0's block table (the only one of a model without sliding-window layers)."""
        return self.block_tables[0]

    @block_ids.setter
    def block_ids(self, ids: list[int]) -> None:
        self.block_tables[0] = ids

    def set_max_model_len(self, max_model_len: int) -> None:
        """Fixes the context limit and the resulting max_tokens (None -> whatever the context leaves)."""
        self.max_model_len = max_model_len
        room = max(1, max_model_len - self.num_prompt_tokens)
        self.max_tokens = room if self._requested_max_tokens is None else self._requested_max_tokens

    # ---- token accounting ----
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by outputs. A live list: read it, do not modify it."""
        return self._all_token_ids

    @property
    def max_kv_tokens(self) -> int:
        """Most KV slots this request can ever hold: the last sampled token is never written."""
        limit = self.num_prompt_tokens + self.max_tokens - 1
        if self.max_model_len is not None:
            limit = min(limit, self.max_model_len)
        return max(limit, self.num_prompt_tokens)

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        if isinstance(token_ids, Integral):
            token_ids = (token_ids,)
        for t in token_ids:
            self.output_token_ids.append(int(t))
            self._all_token_ids.append(int(t))
        if self.first_token_time is None and self.output_token_ids:
            self.first_token_time = time.monotonic()

    # ---- status ----
    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> FinishReason | None:
        return _STATUS_TO_REASON.get(self.status)

    @property
    def queue_time(self) -> float | None:
        """Seconds from arrival to the first schedule (None while still waiting)."""
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    def check_stop(self) -> FinishReason | None:
        """Stop checks that need no text, after the last appended token.

        EOS (unless ignore_eos) and stop_token_ids count only once min_tokens outputs exist;
        max_tokens and max_model_len always apply. Sets stop_reason for a stop token id.
        A stop token that is also the max_tokens-th output reports 'stop' (vLLM says 'length').
        """
        n_out = self.num_output_tokens
        if n_out == 0:
            return None
        if n_out >= self.min_tokens:
            last = self.output_token_ids[-1]
            if not self.ignore_eos and last in self.eos_token_ids:
                return "stop"
            if last in self.stop_token_ids:
                self.stop_reason = last
                return "stop"
        if n_out >= self.max_tokens:
            return "length"
        if self.max_model_len is not None and self.num_tokens >= self.max_model_len:
            return "length"
        return None

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens}, blocks={self.block_ids})")
