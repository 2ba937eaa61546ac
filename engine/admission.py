"""How requests enter and leave the engine (LLMEngine's part): validation, a request's n completions created as the
scheduler has room for them, structured-output requests admitted once their grammar has compiled, abort."""
from __future__ import annotations

from typing import Iterable, Optional, Union

from engine import request_checks
from engine.core.request import Request
from engine.lora.request import LoRARequest
from engine.pooling.model import check_kind
from engine.pooling.params import PoolingParams
from engine.req_state import ChildState, ParentState
from engine.sample.sampling import SamplingParams
from engine.tokenization.detokenizer import IncrementalDetokenizer

PromptType = request_checks.PromptType


class RequestAdmission:
    """Mixed into LLMEngine, whose state it reads: parents, children, _fanning, _compiling, _child_parent, scheduler,
    structured, pooling, speculator, lora, tokenizer, config, max_model_len, eos_token_ids."""

    def encode_prompt(self, prompt: PromptType) -> tuple[Optional[str], list[int]]:
        return request_checks.encode_prompt(self.tokenizer, prompt)

    def add_request(self, request_id: Optional[str], prompt: PromptType,
                    params: Optional[SamplingParams] = None, lora_request: Optional[LoRARequest] = None) -> str:
        """Queues a request; raises ValueError/TypeError (holding nothing) if it cannot run. lora_request: the
        LoRA adapter it runs with (read now if it is not in RAM: a bad adapter fails this request alone).

        Its n completions are created as the scheduler has room for them (see _fan_out), so a large n
        costs memory only for the completions that run or wait, and an abort stops the fan-out.
        """
        params = params or SamplingParams()
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids = self.encode_prompt(prompt)
        self.validate_request(ids, params)
        types = request_checks.token_type_ids(prompt, len(ids), self.config.type_vocab_size)
        self.check_lora(lora_request)
        pooling = params if isinstance(params, PoolingParams) else None
        if pooling is not None:  # one completion that runs its prompt and samples nothing
            params = SamplingParams(temperature=0, max_tokens=1, detokenize=False)
        parent = ParentState(request_id, text, ids, params, pooling_params=pooling, lora_request=lora_request,
                             token_type_ids=types)
        so = params.structured_outputs
        if so is not None:
            backend, fut = self.structured.check(so), self.structured.compile(so)
            if not fut.done():  # _admit_ready admits it; the scheduler's refusals come now, as for any request
                self.scheduler.check_request(self._make_child(parent, 0, with_grammar=False).request)
                self.parents[request_id] = parent
                self._compiling[request_id] = (parent, backend, fut)
                return request_id
            if fut.exception() is not None:
                raise fut.exception()
            parent.grammar = (backend, fut.result())
        self._admit(parent, self._make_child(parent, 0))  # raises before anything is registered
        self.parents[request_id] = parent
        self._fan_out(parent)
        return request_id

    def _admit_ready(self, failures: dict[str, BaseException]) -> None:
        """Admits the requests whose grammar has compiled (fails those whose grammar did not)."""
        for rid, (parent, backend, fut) in list(self._compiling.items()):
            if not fut.done():
                continue
            del self._compiling[rid]
            try:
                parent.grammar = (backend, fut.result())
                self._admit(parent, self._make_child(parent, 0))
                self._fan_out(parent)
            except Exception as e:
                self._fail_parent(rid, e, failures)

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Everything add_request checks about a prompt and its params, without queueing anything.

        Reads only what never changes after load, so callers on other threads (the server) may use it.
        """
        check_kind(self.pooling, params)
        if self.pooling is not None:
            self.pooling.check(params)
            params = SamplingParams(max_tokens=1)  # its prompt runs as a one-token request: the same checks
        request_checks.validate_request(prompt_token_ids, params, self.config.vocab_size, self.max_model_len)
        if params.structured_outputs is not None:
            self.structured.check(params.structured_outputs)  # the backend's own checks: ValueError naming them

    def check_lora(self, lora_request: Optional[LoRARequest]) -> None:
        """ValueError unless the adapter can run here (loads it into RAM, the engine thread's part)."""
        if lora_request is None:
            return
        if not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {type(lora_request).__name__}")
        if self.lora is None:
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r} requested, but LoRA is not enabled (start the "
                             f"engine with enable_lora=True, --enable-lora)")
        self.lora.load(lora_request)

    def _make_child(self, parent: ParentState, index: int, with_grammar: bool = True) -> ChildState:
        """Completion `index` of a request, built whole (everything that can fail) but not yet scheduled."""
        params = parent.params
        child_params = params
        if params.n > 1:
            child_params = params.clone()
            child_params.n = child_params.best_of = 1
            child_params.seed = params.child_seed(index)  # distinct but reproducible samples
            if index > 0:
                child_params.prompt_logprobs = None  # computed once; lets the children share the prefix
        child_id = parent.request_id if params.n == 1 else f"{index}_{parent.request_id}"
        ids = parent.prompt_token_ids
        lora = parent.lora_request
        req = Request(child_id, ids, child_params, eos_token_ids=self.eos_token_ids, max_model_len=self.max_model_len,
                      lora_id=lora.lora_int_id if lora else 0,
                      lora_name=f"{lora.lora_name}@{lora.lora_path}" if lora else None)
        pooling = self.pooling.new_pool(parent.pooling_params) if parent.pooling_params is not None else None
        if pooling is not None and (pooling.type != "LAST" or self.config.bidirectional):
            req.skip_prefix_cache = True  # every position's row is pooled, or sees later ones: none may be cached
        return ChildState(req, child_params, index, IncrementalDetokenizer(self.tokenizer, child_params, ids),
                          child_params.make_generator(),
                          logprobs=[] if child_params.logprobs is not None else None,
                          prompt_logprobs=[] if child_params.prompt_logprobs is not None else None,
                          grammar=self.structured.matcher(*parent.grammar, parent.params.structured_outputs)
                          if with_grammar and parent.grammar else None, pooling=pooling)

    def _admit(self, parent: ParentState, child: ChildState) -> None:
        child_id = child.request_id
        self.scheduler.add_request(child.request)  # the last check that can refuse (KV larger than the pool)
        parent.children.append(child)
        self.children[child_id] = child
        self._child_parent[child_id] = parent.request_id

    def _fan_out(self, parent: Optional[ParentState] = None) -> None:
        """Creates pending completions while fewer than max_num_seqs requests wait to be scheduled."""
        if parent is not None and parent.num_pending_children:
            self._fanning[parent.request_id] = parent
        room = self.scheduler.max_num_seqs - self.scheduler.num_waiting
        for pid, p in list(self._fanning.items()):
            while p.num_pending_children and room > 0:
                self._admit(p, self._make_child(p, len(p.children)))
                room -= 1
            if not p.num_pending_children or pid not in self.parents:
                del self._fanning[pid]

    def abort_request(self, request_ids: Union[str, Iterable[str]]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in ids:
            parent = self.parents.pop(rid, None)
            self._fanning.pop(rid, None)
            self._compiling.pop(rid, None)
            if parent is None:
                continue
            for c in parent.children:
                self.scheduler.finish_requests(c.request_id, "abort")
                self._forget(c.request_id)

    def _forget(self, child_id: str) -> None:
        self.children.pop(child_id, None)
        if self.speculator is not None:
            self.speculator.forget(child_id)
        self._child_parent.pop(child_id, None)
