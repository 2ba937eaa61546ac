"""LLMEngine: add_request / step / abort. One step = schedule -> execute -> sample -> update_from_output."""
from __future__ import annotations

import atexit
import itertools
import sys
import threading
import time
from typing import Iterable, Optional, Union

import numpy as np

from engine.args import EngineArgs
from engine.tokenization.detokenizer import IncrementalDetokenizer, fill_decoded_tokens
from engine.core.kv_cache import KVCacheManager
from engine.model import fused_compile
from engine.outputs import RequestOutput
from engine.req_state import ChildState, ParentState
from engine.core.request import Request
from engine.worker.runner import ModelRunner, SeqChunk
from engine.sample.sampler import Sampler, SamplingRow, prompt_logprobs_for
from engine.sample.sampling import SamplingParams
from engine.core.scheduler import Scheduler

PromptType = Union[str, dict, list]
LOGITS_SLICE = 128  # prompt-logprob rows turned into logits at once (128 x 262k f32 = 134 MB)


def _import_torch() -> None:
    try:
        import torch
        torch.mm(torch.zeros(1, 1), torch.zeros(1, 1))
    except Exception:  # the prefill path will raise a clear error itself if torch is unusable
        pass


class LLMEngine:
    def __init__(self, args: EngineArgs):
        from engine.loading import load_everything
        self.args = args
        t0 = time.perf_counter()
        loaded = load_everything(args)
        self.model, self.config, self.tokenizer = loaded.model, loaded.config, loaded.tokenizer
        self.model_path, self.max_model_len = loaded.model_path, loaded.max_model_len
        self.runner = ModelRunner(self.model, loaded.num_blocks, args.block_size, args.kv_cache_dtype)
        from offload.apply import bind_runner
        bind_runner(self.runner, self.model)  # layers placed on a GPU keep their KV there
        # --num-cpu-blocks: the plan's RAM tier (None without device KV); preemption swaps into it.
        self.kv_tier = getattr(self.model, "kv_tier", None)
        self.kv_manager = KVCacheManager(loaded.num_blocks, args.block_size, args.enable_prefix_caching,
                                         num_cpu_blocks=self.kv_tier.num_blocks if self.kv_tier else 0)
        self.scheduler = Scheduler(self.kv_manager, max_num_batched_tokens=args.max_num_batched_tokens,
                                   max_num_seqs=args.max_num_seqs, max_model_len=self.max_model_len,
                                   enable_chunked_prefill=args.enable_chunked_prefill)
        self.eos_token_ids = tuple(self.tokenizer.eos_token_ids)
        self.sampler = Sampler(self.eos_token_ids, seed=args.seed)
        self.parents: dict[str, ParentState] = {}
        self.children: dict[str, ChildState] = {}
        self._child_parent: dict[str, str] = {}
        self._ids = itertools.count()
        self._torch_thread: Optional[threading.Thread] = None
        self.import_torch_when_idle = True  # one-shot callers (ramlm generate) turn it off: exit would wait for it
        self._warm_up()
        self.load_seconds = time.perf_counter() - t0
        # Counters for statistics (the server's /metrics reads them).
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0

    def _warm_up(self) -> None:
        """A dummy short chunk and a decode through every layer, so that the kernels are loaded from
        the JIT cache (or compiled) before the first request, not during it. Only blocks that no
        request holds yet are written; they are overwritten when handed out. torch, which only long
        prefill chunks use, is imported on a background thread once the engine is first idle (see step): it
        alone takes 1.5-3 s here and holds the GIL for much of it (started during the warm-up it stretched the
        warm-up from 0.7 to 2.5 s; started after it, the first token waited 0.3 s)."""
        from cpu_kernels.quant.linear import GEMV_MAX_M
        bs = self.runner.block_size
        n = min(GEMV_MAX_M, (self.runner.num_blocks - 1) * bs - 1)
        if n < 2:
            return
        blocks = tuple(range(1, 1 + (n + 1 + bs - 1) // bs))
        hidden = self.runner.execute_hidden([SeqChunk((0,) * n, 0, blocks, "last")])
        self.runner.compute_logits(hidden[0], per_row=True)
        self.runner.execute_hidden([SeqChunk((0,), n, blocks, "last")])

    # ---- requests ----
    def encode_prompt(self, prompt: PromptType) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
            if "prompt" in prompt:
                return prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
            raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in prompt):
            return None, [int(t) for t in prompt]
        raise TypeError(f"prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}")

    def add_request(self, request_id: Optional[str], prompt: PromptType,
                    params: Optional[SamplingParams] = None) -> str:
        params = params or SamplingParams()
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids = self.encode_prompt(prompt)
        self._validate(ids, params)
        parent = ParentState(request_id, text, ids, params)
        for i in range(params.n):
            child_params = params
            if params.n > 1:
                child_params = params.clone()
                child_params.n = 1
                if params.seed is not None:
                    child_params.seed = params.seed + i  # distinct but reproducible samples
                if i > 0:
                    child_params.prompt_logprobs = None  # computed once; lets the children share the prefix
            child_id = request_id if params.n == 1 else f"{i}_{request_id}"
            req = Request(child_id, ids, child_params, eos_token_ids=self.eos_token_ids,
                          max_model_len=self.max_model_len)
            self.scheduler.add_request(req)
            child = ChildState(req, child_params, i, IncrementalDetokenizer(self.tokenizer, child_params, ids),
                               child_params.make_generator(),
                               logprobs=[] if child_params.logprobs is not None else None,
                               prompt_logprobs=[] if child_params.prompt_logprobs is not None else None)
            parent.children.append(child)
            self.children[child_id] = child
            self._child_parent[child_id] = request_id
        self.parents[request_id] = parent
        return request_id

    def _validate(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) > self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than max_model_len ({self.max_model_len})")
        vocab = self.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary (size {vocab})")
        params.verify_token_ids(vocab)

    def abort_request(self, request_ids: Union[str, Iterable[str]]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in ids:
            parent = self.parents.pop(rid, None)
            if parent is None:
                continue
            for c in parent.children:
                self.scheduler.finish_requests(c.request.request_id, "abort")
                self._forget(c.request.request_id)

    def _forget(self, child_id: str) -> None:
        self.children.pop(child_id, None)
        self._child_parent.pop(child_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.parents)

    # ---- one step ----
    def step(self) -> list[RequestOutput]:
        try:
            return self._step()
        finally:
            # torch (long prefill chunks) is imported in the background once the engine is idle: during a
            # first token it would hold the GIL (0.3 s), during decode steps it halved their speed for ~2 s.
            # A long prompt before that imports it in line.
            if not self.has_unfinished_requests() and self.import_torch_when_idle:
                self._start_torch_import()

    def _start_torch_import(self) -> None:
        if self._torch_thread is None:
            target = None if "torch" in sys.modules else _import_torch  # a long prompt may have imported it
            self._torch_thread = threading.Thread(target=target, name="ramlm-import-torch", daemon=True)
            self._torch_thread.start()
            # The interpreter must not exit while the thread is inside torch: 6 processes in 10 aborted at exit
            # ("terminate called without an active exception") when a long prompt ran just before the end.
            atexit.register(self._torch_thread.join)

    def import_torch_now(self) -> None:
        """Finish importing torch now (servers before they accept requests, benchmarks before they time)."""
        self._start_torch_import()
        self._torch_thread.join()

    def _step(self) -> list[RequestOutput]:
        so = self.scheduler.schedule()
        self._swap(so)  # before the early return: freed device blocks may be reused next step
        if so.is_empty:
            return []
        now = time.time()
        chunks, want_prompt_lp = [], []
        for s in so.scheduled:
            child = self.children[s.req_id]
            parent = self.parents[self._child_parent[s.req_id]]
            parent.first_scheduled_time = parent.first_scheduled_time or now
            prompt_lp = child.prompt_logprobs is not None and s.start_pos < child.request.num_prompt_tokens - 1
            want_prompt_lp.append(prompt_lp)
            mode = "all" if prompt_lp else ("last" if s.sample else "none")
            chunks.append(SeqChunk(s.token_ids, s.start_pos, s.block_ids, mode))
        hidden = self.runner.execute_hidden(chunks)
        for s, h, lp in zip(so.scheduled, hidden, want_prompt_lp):
            if lp:
                self._prompt_logprobs(self.children[s.req_id], s.start_pos, h)
        sampled = self._sample(so.scheduled, hidden)
        if sampled and fused_compile.pending():
            fused_compile.start_pending()  # after a first token, not before it (fused_compile's docstring)
        self.num_prompt_tokens += sum(s.num_tokens for s in so.scheduled if not s.sample or
                                      s.start_pos + len(s.token_ids) <= self.children[s.req_id].request.num_prompt_tokens)
        finished = {req.request_id: reason for req, reason in self.scheduler.update_from_output(so, sampled)}
        touched: dict[str, None] = {}
        for rid, tokens in sampled.items():
            child = self.children[rid]
            self.num_generation_tokens += 1
            reason = finished.get(rid)
            stop_str = child.detok.update(tokens, stop_terminated=reason == "stop", finished=reason is not None)
            if stop_str is not None:
                if reason is None:
                    self.scheduler.finish_requests(rid, "stop")
                reason = "stop"
                child.stop_reason = stop_str
            elif reason == "stop":
                child.stop_reason = child.request.stop_reason
            if reason is not None:
                child.finish_reason = reason
            touched[self._child_parent[rid]] = None
        return [self._output(pid) for pid in touched]

    def _swap(self, so) -> None:
        """Copies the step's swapped blocks between the device KV and the RAM tier (one direction per step)."""
        if so.blocks_to_swap_out:
            self.kv_tier.swap_out(*zip(*so.blocks_to_swap_out))
        if so.blocks_to_swap_in:
            self.kv_tier.swap_in([h for _, h in so.blocks_to_swap_in], [d for d, _ in so.blocks_to_swap_in])

    def _prompt_logprobs(self, child: ChildState, start: int, hidden_rows: np.ndarray) -> None:
        prompt = child.request.prompt_token_ids
        last_scored = len(prompt) - 1  # rows at positions < P - 1 score a prompt token
        n = min(hidden_rows.shape[0], last_scored - start)
        k = child.params.prompt_logprobs
        for a in range(0, n, LOGITS_SLICE):
            b = min(n, a + LOGITS_SLICE)
            logits = self.runner.compute_logits(hidden_rows[a:b])
            entries = prompt_logprobs_for(logits, prompt, k, start=start + a)
            fill_decoded_tokens(self.tokenizer, entries)
            child.prompt_logprobs.extend(entries)
        if start == 0 and n == 0:
            child.prompt_logprobs.append(None)

    def _sample(self, scheduled, hidden) -> dict[str, list[int]]:
        rows, ids = [], []
        for s, h in zip(scheduled, hidden):
            if s.sample:
                rows.append(h[-1])
                ids.append(s.req_id)
        if not rows:
            return {}
        logits = self.runner.compute_logits(np.stack(rows), per_row=True)
        srows = []
        for rid in ids:
            c = self.children[rid]
            srows.append(SamplingRow(c.params, c.generator, c.request.prompt_token_ids, c.request.output_token_ids))
        out = self.sampler.sample(logits, srows)
        result = {}
        for i, rid in enumerate(ids):
            tok = int(out.token_ids[i])
            c = self.children[rid]
            if c.logprobs is not None:
                lp = out.logprobs[i]
                fill_decoded_tokens(self.tokenizer, [lp])
                c.logprobs.append(lp)
                c.cumulative_logprob += lp[tok].logprob
            result[rid] = [tok]
        return result

    def _output(self, parent_id: str) -> RequestOutput:
        parent = self.parents[parent_id]
        now = time.time()
        if parent.first_token_time is None:
            parent.first_token_time = now
        outputs = [c.completion() for c in parent.children]
        c0 = parent.children[0]
        prompt_lp = c0.prompt_logprobs
        finished = parent.finished
        out = RequestOutput(parent.request_id, parent.prompt, list(parent.prompt_token_ids), prompt_lp,
                            outputs, finished, metrics=parent.metrics(),
                            num_cached_tokens=c0.request.num_cached_tokens)
        if finished:
            del self.parents[parent_id]
            for c in parent.children:
                self._forget(c.request.request_id)
        return out

    def stats(self):
        return self.scheduler.make_stats()
