"""Token-budget scheduler (vLLM v1's shape): each step closes part of every request's
num_tokens - num_computed_tokens gap, so prefill, chunked prefill, prefix hits and decode are one path.

Loop: schedule() -> runner executes -> update_from_output(). Not thread-safe: the engine calls
everything (aborts included) from its one loop thread.

Policy:
  - running requests first (decodes and unfinished prompt chunks), in arrival order; then waiting
    requests, strict FCFS (the queue head blocks the rest), while len(running) < max_num_seqs;
  - chunked prefill: a prompt larger than the step's remaining budget runs in pieces;
  - when blocks run out, the last-arrived running request is preempted and goes back to the front
    of the queue. With a RAM tier (KVCacheManager num_cpu_blocks) holding enough free blocks, its
    whole block table is swapped out (SchedulerOutput.blocks_to_swap_out) and swapped back into fresh
    device blocks when it is admitted again (blocks_to_swap_in), keeping num_computed_tokens: no
    recompute. Otherwise its blocks are freed and it is recomputed (its computed full blocks stay in
    the prefix cache until evicted, tail first, so part of the recompute is often a cache hit);
  - no waiting request is admitted (so nothing is swapped in) in a step that preempted: a step's
    swaps all go one way, so no block is freed by one swap and written by another in the same step;
  - running stays in arrival order and every running request arrived before every waiting one, so
    the oldest request always progresses: no livelock, and add_request rejects any request that
    could not fit in the pool even alone, so nothing waits forever.
n > 1 children sharing a prompt share its full blocks through the prefix cache only when a child is
admitted in a later step than the first child's prefill: blocks are published after their KV is
computed (update_from_output), never while being written in the same step.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from numbers import Integral

from engine.core.kv_cache import KVCacheManager
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.scheduler_output import ScheduledRequest, SchedulerOutput, SchedulerStats


class Scheduler:
    """Args:
        kv_cache_manager: owns the block pool.
        max_num_batched_tokens: token budget of one step.
        max_num_seqs: most requests running at once.
        max_model_len: context limit (prompt + outputs).
        enable_chunked_prefill: False -> a prompt runs in one step (needs max_num_batched_tokens >= max_model_len).
        long_prefill_token_threshold: > 0 caps the tokens one request gets per step.
        spec_step_rows: speculative drafts ride along only while a step's decoding requests and their drafts stay
            within this many rows (beyond it a CPU step's cost grows with every row: drafts would slow it down).
        max_loras: most distinct LoRA adapters (Request.lora_id) among running requests; a waiting request of
            another adapter is passed over (the next ones may run) until one ends. 0: no limit.
    """

    def __init__(self, kv_cache_manager: KVCacheManager, *, max_num_batched_tokens: int = 2048,
                 max_num_seqs: int = 128, max_model_len: int, enable_chunked_prefill: bool = True,
                 long_prefill_token_threshold: int = 0, spec_step_rows: int = 8, max_loras: int = 0):
        if max_num_batched_tokens < 1 or max_num_seqs < 1 or max_model_len < 1:
            raise ValueError("max_num_batched_tokens, max_num_seqs and max_model_len must be positive")
        if not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
            raise ValueError(f"without chunked prefill max_num_batched_tokens ({max_num_batched_tokens}) must be "
                             f">= max_model_len ({max_model_len}), or a long prompt could never run")
        self.kv = kv_cache_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.spec_step_rows = spec_step_rows
        self.max_loras = max_loras
        self.requests: dict[str, Request] = {}  # live (waiting or running) requests
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_swap_outs = 0  # preemptions that went to the RAM tier (requests)
        self.num_swap_ins = 0

    # ---- requests in and out ----
    def add_request(self, request: Request) -> None:
        """Queues a request. Raises ValueError for a duplicate live id, a prompt longer than
        max_model_len, or a request whose KV could not fit in the whole pool even alone."""
        self.check_request(request)
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def check_request(self, request: Request) -> None:
        """add_request's checks (the ValueErrors it raises) without queueing the request."""
        rid = request.request_id
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use")
        if request.max_model_len is None or request.max_model_len > self.max_model_len:
            request.set_max_model_len(self.max_model_len)
        if request.num_prompt_tokens > self.max_model_len:
            raise ValueError(f"request {rid!r}: prompt of {request.num_prompt_tokens} tokens is longer than "
                             f"max_model_len={self.max_model_len}")
        short = self.kv.shortfall_alone(request.max_kv_tokens, self.max_num_batched_tokens)
        if short is not None:
            raise ValueError(f"request {rid!r}: up to {request.max_kv_tokens} tokens of KV need {short[0]} blocks of "
                             f"{self.kv.block_size}, but the KV cache has only {short[1]}; "
                             f"lower max_tokens or give the KV cache more memory")

    def finish_requests(self, request_ids: str | Iterable[str], reason: FinishReason = "abort") -> list[Request]:
        """Finishes live requests at any time (abort, or a stop string found by the detokenizer),
        freeing their blocks. Unknown or already finished ids are ignored. Returns those finished."""
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        done = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None:
                self._finish(req, reason)
                done.append(req)
        return done

    def abort_requests(self, request_ids: str | Iterable[str]) -> list[Request]:
        return self.finish_requests(request_ids, "abort")

    def _finish(self, req: Request, reason: FinishReason) -> None:
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        req.status = RequestStatus.from_finish_reason(reason)
        req.finished_time = time.monotonic()
        self.kv.free(req)
        del self.requests[req.request_id]

    def _preempt(self, req: Request, swap_out: list[tuple[int, int]]) -> None:
        """Swaps req's blocks to the RAM tier (pairs appended to swap_out) when it has room, else frees
        them for a recompute; either way req waits at the front of the queue."""
        # A request with no token to run (its sample not back yet) is recomputed: swapped, it would wait forever.
        pairs = self.kv.swap_out(req) if req.num_tokens > req.num_computed_tokens else None
        if pairs is None:
            self.kv.free(req)
            req.num_computed_tokens = 0
        else:
            swap_out.extend(pairs)
            self.num_swap_outs += 1
        req.status = RequestStatus.PREEMPTED
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # ---- the step ----
    def _cap(self, num_new: int, budget: int) -> int:
        if 0 < self.long_prefill_token_threshold < num_new:
            num_new = self.long_prefill_token_threshold
        return min(num_new, budget)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        picked: list[tuple[Request, int, list[int]]] = []  # request, num tokens, draft tokens after them
        preempted = False
        swap_out: list[tuple[int, int]] = []  # (device block, host block), device -> RAM
        swap_in: list[tuple[int, int]] = []  # (device block, host block), RAM -> device

        # Drafts share a step's rows: the decodes and drafts together stay within spec_step_rows.
        decoding = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
        drafting = sum(1 for r in decoding if r.spec_token_ids)
        allowance = max(0, self.spec_step_rows - len(decoding)) // max(1, drafting)
        drafts: list[tuple[int, list[int]]] = []  # (index in picked, drafts) of decodes that have some
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._cap(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:  # nothing to run (no token sampled yet)
                i += 1
                continue
            spec, req.spec_token_ids = (req.spec_token_ids[:allowance] if n == 1 else []), []
            new_ids = self.kv.allocate_slots(req, n)
            while new_ids is None:
                victim = self.running.pop()  # the last arrived; never one already picked (those are < i)
                self._preempt(victim, swap_out)
                preempted = True
                if victim is req:
                    break
                new_ids = self.kv.allocate_slots(req, n)
            if new_ids is None:
                break
            picked.append((req, n, []))
            if spec:
                drafts.append((len(picked) - 1, spec))
            budget -= n
            i += 1

        # Then drafts, from what the step has left: never a preemption or a decode's block for a draft.
        for j, spec in drafts:
            req, n, _ = picked[j]
            if req.status is RequestStatus.RUNNING and len(spec) <= budget and self.kv.hold_drafts(req, n, len(spec)):
                picked[j] = (req, n, spec)
                budget -= len(spec)

        if not preempted:
            loras = {r.lora_id for r in self.running if r.lora_id}
            passed_over: list[Request] = []  # waiting for an adapter slot: back at the front, in order, after
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                if self.max_loras and req.lora_id and req.lora_id not in loras and len(loras) >= self.max_loras:
                    passed_over.append(self.waiting.popleft())
                    continue
                swapped = self.kv.is_swapped(req)
                if swapped:  # its KV is in the RAM tier: everything computed stays computed
                    num_hit = req.num_computed_tokens
                else:
                    hit_ids, num_hit = self.kv.get_computed_blocks(req)
                n = req.num_tokens - num_hit
                if not self.enable_chunked_prefill and n > budget:
                    break
                n = self._cap(n, budget)
                if swapped:
                    if not self.kv.can_swap_in(req, n):
                        break
                    swap_in += self.kv.swap_in(req)
                    self.num_swap_ins += 1
                    new_ids = self.kv.allocate_slots(req, n)  # fits: can_swap_in counted these blocks
                else:
                    new_ids = self.kv.allocate_slots(req, n, num_hit, hit_ids)
                if new_ids is None:
                    break
                self.waiting.popleft()
                self.running.append(req)
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = num_hit
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = time.monotonic()
                    req.num_cached_tokens = num_hit
                picked.append((req, n, []))
                budget -= n
                if req.lora_id:
                    loras.add(req.lora_id)
            self.waiting.extendleft(reversed(passed_over))

        scheduled = []
        for req, n, spec in picked:
            start = req.num_computed_tokens
            req.num_computed_tokens = start + n + len(spec)
            scheduled.append(ScheduledRequest(
                req_id=req.request_id, token_ids=tuple(req.all_token_ids[start:start + n]) + tuple(spec),
                start_pos=start, block_ids=tuple(req.block_ids), sample=req.num_computed_tokens >= req.num_tokens,
                group_block_ids=tuple(tuple(t) for t in req.block_tables[1:]),
                state_slot=req.state_slot, state_snapshot=req.state_snapshot, spec_token_ids=tuple(spec)))
        return SchedulerOutput(scheduled=tuple(scheduled), blocks_to_swap_out=tuple(swap_out),
                               blocks_to_swap_in=tuple(swap_in), state_copies=tuple(self.kv.take_state_copies()))

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           sampled: dict[str, list[int]]) -> list[tuple[Request, FinishReason]]:
        """Publishes computed blocks to the prefix cache, appends sampled tokens and applies the stop
        checks that need no text (EOS, stop_token_ids, max_tokens, max_model_len).

        Args:
            sampled: req_id -> sampled tokens, for exactly the entries with `sample` true (others
                are ignored). Requests finished meanwhile (aborted) are skipped.
        Returns:
            (request, reason) for each request that finished now; their blocks are already freed.
        """
        finished = []
        for s in scheduler_output.scheduled:
            req = self.requests.get(s.req_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            if s.spec_token_ids:  # the rejected drafts' KV is not the request's: written over later, never cached
                accepted = len(sampled.get(s.req_id) or ()) - 1
                self.kv.take_back_drafts(req, len(s.spec_token_ids), max(accepted, 0))
            # accepted drafts are appended below: blocks they complete enter the cache at the next step
            self.kv.cache_blocks(req, min(req.num_computed_tokens, req.num_tokens))
            if not s.sample:
                continue
            tokens = sampled.get(s.req_id)
            if isinstance(tokens, Integral):
                tokens = (tokens,)
            if tokens is None or len(tokens) == 0:
                # Without a token the request would have nothing left to run and wait forever.
                raise ValueError(f"no sampled token for request {s.req_id!r}, which sampled this step")
            for t in tokens:
                req.append_output_token_ids(t)
                reason = req.check_stop()
                if reason is not None:
                    self._finish(req, reason)
                    finished.append((req, reason))
                    break
        return finished

    # ---- state and statistics ----
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def reset_prefix_cache(self) -> bool:
        return self.kv.reset_prefix_cache()

    def make_stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running), num_waiting=len(self.waiting), kv_cache_usage=self.kv.usage,
            prefix_cache_queries=self.kv.prefix_cache_queries, prefix_cache_hits=self.kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions, num_swapped=self.kv.swap_space.num_swapped,
            num_swap_outs=self.num_swap_outs, num_swap_ins=self.num_swap_ins,
            cpu_kv_cache_usage=self.kv.swap_space.usage)
