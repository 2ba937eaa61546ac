"""LLMEngine: add_request / step / abort. One step = schedule -> execute -> sample -> update_from_output."""
from __future__ import annotations

import atexit
import dataclasses
import functools
import itertools
from concurrent import futures
import sys
import threading
import time
from typing import Optional

import numpy as np

from cpu_kernels.heap import keep_freed_heap
from engine import request_checks
from engine.args import EngineArgs
from engine.tokenization.detokenizer import fill_decoded_tokens
from engine.core.hybrid_cache import HybridKVCacheManager
from engine.core.kv_cache import KVCacheManager
from engine.errors import RequestsFailed
from engine.model import fused_compile
from engine.outputs import RequestOutput
from engine.admission import RequestAdmission
from engine.lora.manager import LoRAManager
from engine.lora.steps import LoRASteps
from engine.req_state import ChildState, ParentState
from engine.worker.runner import ModelRunner, SeqChunk
from engine.pooling.model import PoolingModel
from engine.sample.sampler import Sampler, SamplingRow, prompt_logprobs_for
from engine.core.scheduler import Scheduler
from engine.structured.manager import StructuredOutputs
from engine.spec_decode.config import SPEC_STEP_ROWS
from engine.spec_decode.speculator import Speculator
from engine.spec_decode.stats import SpecStats

PromptType = request_checks.PromptType
LOGITS_SLICE = 128  # prompt-logprob rows turned into logits at once (128 x 262k f32 = 134 MB)
GRAMMAR_WAIT_S = 0.05  # an idle step waits this long for a compiling grammar instead of spinning
GRAMMAR_END = "structured_outputs: the grammar accepts no further token"  # stop_reason of such a completion


def _import_torch() -> None:
    try:
        import torch
        torch.mm(torch.zeros(1, 1), torch.zeros(1, 1))
    except Exception:  # the prefill path will raise a clear error itself if torch is unusable
        pass


class LLMEngine(RequestAdmission, LoRASteps):
    def __init__(self, args: EngineArgs):
        from engine.loading import load_everything
        keep_freed_heap()
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
        if self.runner.num_state_slots:  # linear-attention layers: a state per request beside the KV blocks
            if len(self.runner.groups) > 1:
                raise ValueError("models with both linear-attention and sliding-window layers are not supported "
                                 "(the state cache keeps one block table per request)")
            self.kv_manager = HybridKVCacheManager(self.runner.num_blocks, args.block_size, args.enable_prefix_caching,
                                                   num_state_slots=self.runner.num_state_slots)
        else:
            self.kv_manager = KVCacheManager(self.runner.group_num_blocks, args.block_size,
                                             args.enable_prefix_caching,
                                             num_cpu_blocks=self.kv_tier.num_blocks if self.kv_tier else 0,
                                             windows=self.runner.windows)
        self.pooling = PoolingModel.build(args, self.model, self.model_path, self.tokenizer)  # None: generating
        if self.config.bidirectional and self.pooling is None:
            raise ValueError("this model attends bidirectionally (an encoder: EmbeddingGemma, BERT): it pools, give "
                             "runner='pooling'")
        self.lora = LoRAManager.build(args, self.model, self.config)  # None without enable_lora
        self._lora_slot_of: dict[int, int] = {}  # this step's adapters: lora id -> slot
        self.speculator = Speculator.build(args.speculative_config, self.model, self.runner,
                                           dataclasses.replace(args, max_model_len=self.max_model_len), self.config)
        whole = self.config.bidirectional  # an encoder's prompt runs in one step: every row attends over all of it
        self.scheduler = Scheduler(self.kv_manager, max_num_batched_tokens=max(args.max_num_batched_tokens,
                                                                               self.max_model_len if whole else 0),
                                   max_num_seqs=args.max_num_seqs, max_model_len=self.max_model_len,
                                   enable_chunked_prefill=args.enable_chunked_prefill and not whole,
                                   spec_step_rows=SPEC_STEP_ROWS,
                                   max_loras=args.max_loras if self.lora is not None else 0)
        self.eos_token_ids = tuple(self.tokenizer.eos_token_ids)
        self.sampler = Sampler(self.eos_token_ids, seed=args.seed)
        self.structured = StructuredOutputs(self.tokenizer, self.config.vocab_size, args.structured_outputs_backend)
        # requests admitted once their grammar has compiled: (parent, backend, the compile's future)
        self._compiling: dict[str, tuple[ParentState, str, futures.Future]] = {}
        self.parents: dict[str, ParentState] = {}
        self._fanning: dict[str, ParentState] = {}  # parents with completions still to create, oldest first
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
        if self.speculator is not None:
            self.speculator.warm_up()
        bs = self.runner.block_size
        n = min(GEMV_MAX_M, (min(self.runner.group_num_blocks) - 1) * bs - 1)  # blocks every group has
        if n < 2:
            return
        blocks = tuple(range(1, 1 + (n + 1 + bs - 1) // bs))
        hidden = self.runner.execute_hidden([SeqChunk((0,) * n, 0, blocks, "last")])
        self.runner.compute_logits(hidden[0], per_row=True)
        if not self.config.bidirectional:  # an encoder has no decode step
            self.runner.execute_hidden([SeqChunk((0,), n, blocks, "last")])

    # ---- requests ----
    def has_unfinished_requests(self) -> bool:
        return bool(self.parents)

    # ---- one step ----
    def step(self) -> list[RequestOutput]:
        """One scheduling step; returns the outputs of the requests it advanced.

        Raises:
            RequestsFailed: some requests failed inside the step; they were aborted (blocks freed) and the
                exception carries the other requests' outputs. Any other exception is a failure that
                names no request (the scheduler's own state).
        """
        try:
            failures: dict[str, BaseException] = {}
            outputs = self._step(failures)
            if failures:
                raise RequestsFailed(failures, outputs) from next(iter(failures.values()))
            return outputs
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

    def _step(self, failures: dict[str, BaseException]) -> list[RequestOutput]:
        """schedule -> execute -> sample -> update_from_output. A request whose own part raises is failed
        alone (`failures`, by request id); an error in the batched forward fails the step's requests."""
        self._admit_ready(failures)
        self._fan_out()
        so = self.scheduler.schedule()
        self._swap(so)  # before the early return: freed device blocks may be reused next step
        if so.state_copies:  # prefix-cache hits: each checkpoint into its request's state slot
            self.runner.copy_states(so.state_copies)
        if so.is_empty:
            if self._compiling:  # only grammars to wait for: wait a little for the oldest, not in a busy loop
                futures.wait([f for *_, f in self._compiling.values()], GRAMMAR_WAIT_S, futures.FIRST_COMPLETED)
            return []
        now = time.time()
        live, chunks, want_prompt_lp = [], [], []
        if self.lora is not None:
            self._activate_loras(so, failures)
        for s in so.scheduled:
            if s.req_id not in self.children:  # failed above (its adapter)
                continue
            try:
                child = self.children[s.req_id]
                parent = self.parents[self._child_parent[s.req_id]]
                parent.first_scheduled_time = parent.first_scheduled_time or now
                prompt_lp = child.prompt_logprobs is not None and s.start_pos < child.request.num_prompt_tokens - 1
                every_row = prompt_lp or s.spec_token_ids or child.pooling is not None or (
                    self.speculator and self.speculator.needs_hidden)
                chunks.append(SeqChunk(s.token_ids, s.start_pos, s.block_ids,
                                       "all" if every_row else ("last" if s.sample else "none"),
                                       state_slot=max(s.state_slot, 0), snapshot=s.state_snapshot,
                                       group_block_ids=s.group_block_ids, lora_slot=self._lora_slot(s.req_id),
                                       token_types=parent.token_type_ids[s.start_pos:s.start_pos + s.num_tokens]))
            except Exception as e:
                self._fail(s.req_id, e, failures)
                continue
            live.append(s)
            want_prompt_lp.append(prompt_lp)
        try:
            hidden = self.runner.execute_hidden(chunks) if chunks else []
        except Exception as e:  # one batch: no telling whose row broke it
            for s in live:
                self._fail(s.req_id, e, failures)
            return []
        for s, h, lp in zip(live, hidden, want_prompt_lp):
            if lp:
                try:
                    self._prompt_logprobs(self.children[s.req_id], s.start_pos, h)
                except Exception as e:
                    self._fail(s.req_id, e, failures)
        kept = [(s, h) for s, h in zip(live, hidden) if s.req_id in self.children]
        pooled: list[str] = []
        if self.pooling is not None:  # a pooling model's requests pool their rows and sample nothing
            pooled = self._pool(kept, failures)
            kept = []
        if kept and self.speculator is not None and self.speculator.needs_hidden:  # MTP drafts from every row
            self.speculator.observe_hidden([s for s, _ in kept], [h for _, h in kept],
                                           [self.children[s.req_id].request for s, _ in kept])
        ended: list[str] = []  # completions whose grammar accepts nothing more
        sampled = self._sample([s for s, _ in kept], [h for _, h in kept], failures, ended)
        if sampled and fused_compile.pending():
            fused_compile.start_pending()  # after a first token, not before it (fused_compile's docstring)
        self.num_prompt_tokens += sum(s.num_tokens for s in so.scheduled if s.req_id in self.children and (
            not s.sample or s.req_id in pooled  # (a pooled request, released already, ran only prompt tokens)
            or s.start_pos + len(s.token_ids) <= self.children[s.req_id].request.num_prompt_tokens))
        before = {rid: self.children[rid].request.num_output_tokens for rid in sampled
                  if len(sampled[rid]) > 1 and rid in self.children}
        finished = {req.request_id: reason for req, reason in self.scheduler.update_from_output(so, sampled)}
        touched: dict[str, None] = {}
        for rid, tokens in sampled.items():
            if rid not in self.children:  # failed with a sibling completion
                continue
            if rid in before:  # accepted drafts: only those the scheduler kept (EOS or max_tokens may stop early)
                cut = tokens[self.children[rid].request.num_output_tokens - before[rid]:]
                tokens = tokens[:len(tokens) - len(cut)]
                self.children[rid].drop_logprobs(cut)
            try:
                self._update_text(rid, tokens, finished.get(rid))
            except Exception as e:
                self._fail(rid, e, failures)
                continue
            touched[self._child_parent[rid]] = None
        for rid in pooled:  # its prompt has run: its vector is its output
            touched[self._child_parent[rid]] = None
        for rid in ended:  # finished in the scheduler by _sample
            child = self.children.get(rid)
            if child is None:  # failed with a sibling completion
                continue
            child.detok.flush()
            child.finish_reason, child.stop_reason = "stop", GRAMMAR_END
            child.release()
            touched[self._child_parent[rid]] = None
        if self.speculator is not None:
            self.speculator.propose([(rid, self.children[rid]) for rid in sampled if rid in self.children],
                                    self.scheduler.num_running, self.max_model_len)
        outputs = []
        for pid in touched:
            if pid not in self.parents:
                continue
            try:
                outputs.append(self._output(pid))
            except Exception as e:
                self._fail_parent(pid, e, failures)
        return outputs

    def _update_text(self, rid: str, tokens: list[int], reason: Optional[str]) -> None:
        """Detokenizes a completion's new tokens (several with accepted drafts: one at a time, so that a stop string
        ends it at the token that completes it, as without speculation); a stop string found there finishes it."""
        child = self.children[rid]
        for i, t in enumerate(tokens):
            last = i == len(tokens) - 1
            self.num_generation_tokens += 1
            stop_str = child.detok.update([t], stop_terminated=last and reason == "stop",
                                          finished=last and reason is not None)
            if stop_str is not None:
                if not last:  # the scheduler appended the accepted drafts after this one: they are not the output
                    del child.request.output_token_ids[i + 1 - len(tokens):]
                    del child.request.all_token_ids[i + 1 - len(tokens):]
                    child.drop_logprobs(tokens[i + 1:])
                if not last or reason is None:
                    self.scheduler.finish_requests(rid, "stop")
                child.finish_reason, child.stop_reason = "stop", stop_str
                child.release()
                return
        if reason == "stop":
            child.stop_reason = child.request.stop_reason
        if reason is not None:
            child.finish_reason = reason
            child.release()

    def _fail(self, child_id: str, error: BaseException, failures: dict[str, BaseException]) -> None:
        """Fails the request a scheduled completion belongs to (all its completions), freeing its blocks."""
        parent_id = self._child_parent.get(child_id)
        if parent_id is not None:
            self._fail_parent(parent_id, error, failures)
        elif self.scheduler.finish_requests(child_id, "abort"):  # live, but unknown to the engine: freed too
            self.children.pop(child_id, None)
            failures.setdefault(child_id, error)

    def _fail_parent(self, parent_id: str, error: BaseException, failures: dict[str, BaseException]) -> None:
        self.abort_request(parent_id)
        failures.setdefault(parent_id, error)

    def _swap(self, so) -> None:
        """Copies the step's swapped blocks between the device KV and the RAM tier (one direction per step)."""
        if so.blocks_to_swap_out:
            self.kv_tier.swap_out(*zip(*so.blocks_to_swap_out))
        if so.blocks_to_swap_in:
            self.kv_tier.swap_in([h for _, h in so.blocks_to_swap_in], [d for d, _ in so.blocks_to_swap_in])

    def _pool(self, kept, failures: dict[str, BaseException]) -> list[str]:
        """Adds each pooling request's rows to its pool; those whose prompt has run get their vector and finish
        (before update_from_output, which would want a token). Returns their ids."""
        done = []
        for s, h in kept:
            c = self.children[s.req_id]
            try:
                c.pooling.add(s.start_pos, self.model.final_norm(np.ascontiguousarray(h, dtype=np.float32)))
                if s.sample:
                    c.embedding = c.pooling.result()
                    self.kv_manager.cache_blocks(c.request, c.request.num_computed_tokens)  # as update_from_output would
                    self.scheduler.finish_requests(s.req_id, "stop")
                    c.finish_reason = "stop"
                    c.release()
                    done.append(s.req_id)
            except Exception as e:
                self._fail(s.req_id, e, failures)
        return done

    def _prompt_logprobs(self, child: ChildState, start: int, hidden_rows: np.ndarray) -> None:
        prompt = child.request.prompt_token_ids
        last_scored = len(prompt) - 1  # rows at positions < P - 1 score a prompt token
        n = min(hidden_rows.shape[0], last_scored - start)
        k = child.params.prompt_logprobs
        for a in range(0, n, LOGITS_SLICE):
            b = min(n, a + LOGITS_SLICE)
            slots = self._lora_rows([child.request_id] * (b - a))
            logits = self.runner.compute_logits(hidden_rows[a:b], lora_slots=slots)
            entries = prompt_logprobs_for(logits, prompt, k, start=start + a)
            fill_decoded_tokens(self.tokenizer, entries)
            child.prompt_logprobs.extend(entries)
        if start == 0 and n == 0:
            child.prompt_logprobs.append(None)

    def _sample(self, scheduled, hidden, failures: dict[str, BaseException],
                 ended: list[str]) -> dict[str, list[int]]:
        """One token per scheduled entry that samples. A row whose sampling raises fails its request only:
        the batch is sampled again row by row to find it. Rows under a grammar sample from what it allows; one
        whose grammar allows nothing more samples nothing and goes to `ended`. Entries with drafts get the drafts
        their rows agree with and one token more."""
        rows, ids, verified = [], [], {}
        for s, h in zip(scheduled, hidden):
            if s.req_id not in self.children:  # failed with a sibling completion (n > 1) earlier in this loop
                continue
            if s.sample and s.spec_token_ids:
                c = self.children[s.req_id]
                try:
                    logits_fn = functools.partial(self._spec_logits, self._lora_slot(s.req_id))
                    v = self.speculator.verify(s, h, logits_fn, c, c.generator or
                                               self.sampler.generator, self.eos_token_ids, self.structured.mask)
                    if v.ended:
                        self.scheduler.finish_requests(s.req_id, "stop")  # before update_from_output, as below
                        ended.append(s.req_id)
                    else:
                        c.add_logprobs(self.tokenizer, v.tokens, v.logprobs)
                        verified[s.req_id] = v.tokens
                except Exception as e:
                    self._fail(s.req_id, e, failures)
            elif s.sample:
                rows.append(h[-1])
                ids.append(s.req_id)
        live = [i for i, rid in enumerate(ids) if rid in self.children]  # (a sibling's check may have failed them)
        rows, ids = [rows[i] for i in live], [ids[i] for i in live]
        verified = {rid: t for rid, t in verified.items() if rid in self.children}
        if not rows:
            return verified
        try:
            logits = self.runner.compute_logits(np.stack(rows), per_row=True, lora_slots=self._lora_rows(ids))
        except Exception as e:
            for rid in ids:
                self._fail(rid, e, failures)
            return verified
        srows = []
        for rid in ids:
            c = self.children[rid]
            srows.append(SamplingRow(c.params, c.generator, c.request.prompt_token_ids, c.request.output_token_ids))
        constrained = [i for i, rid in enumerate(ids) if self.children[rid].grammar is not None]
        allowed = self.structured.mask(logits, constrained, [self.children[ids[i]].grammar for i in constrained])
        for i, ok in zip(constrained, allowed):
            if isinstance(ok, Exception):  # this matcher failed: its request alone
                self._fail(ids[i], ok, failures)
        stuck = {ids[i] for i, ok in zip(constrained, allowed) if ok is False}
        try:
            out = self.sampler.sample(logits, srows)
            picks = [(int(out.token_ids[i]), out.logprobs[i]) for i in range(len(ids))]
        except Exception:
            picks = []
            for i, rid in enumerate(ids):
                try:
                    one = self.sampler.sample(logits[i:i + 1], [srows[i]])
                    picks.append((int(one.token_ids[0]), one.logprobs[0]))
                except Exception as e:
                    self._fail(rid, e, failures)
                    picks.append(None)
        result = {}
        for rid, pick in zip(ids, picks):
            if pick is None or rid not in self.children:
                continue
            tok, lp = pick
            c = self.children[rid]
            try:
                if rid in stuck or (c.grammar is not None and not c.grammar.accept(tok)):
                    self.scheduler.finish_requests(rid, "stop")  # before update_from_output, which wants a token
                    ended.append(rid)
                    continue
                c.add_logprobs(self.tokenizer, [tok], [lp])
            except Exception as e:
                self._fail(rid, e, failures)
                continue
            result[rid] = [tok]
        return {**result, **{rid: t for rid, t in verified.items() if rid in self.children}}

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
                            num_cached_tokens=c0.cached_tokens, pooled=c0.embedding)
        if finished:
            del self.parents[parent_id]
            for c in parent.children:
                self._forget(c.request_id)
        return out

    def stats(self):
        return self.scheduler.make_stats()

    @property
    def spec_stats(self) -> SpecStats:
        """Speculative decoding's counters (all zero without it)."""
        return self.speculator.stats if self.speculator is not None else SpecStats(0)
