"""LLM: the offline API, shaped like vLLM's (generate, chat, beam_search; embed, encode, score, classify for pooling
models)."""
from __future__ import annotations

from typing import Iterator, Optional, Sequence, Union

from engine.args import EngineArgs
from engine.engine import LLMEngine, PromptType
from engine.lora.request import LoRARequest
from engine.outputs import (ClassificationOutput, ClassificationRequestOutput, EmbeddingOutput, EmbeddingRequestOutput,
                            PoolingOutput, PoolingRequestOutput, RequestOutput, ScoringOutput, ScoringRequestOutput)
from engine.pooling.params import PoolingParams
from engine.pooling.score import cosine, cross_encoder_input, is_cross_encoder, pair_up
from engine.sample.sampling import SamplingParams


class LLM:
    """LLM(model=None, **engine_args): loads the model (the embedded gemma-3-270m when None).

    Keywords are EngineArgs fields under vLLM's names: max_model_len, dtype, kv_cache_dtype, block_size,
    kv_cache_memory, max_num_batched_tokens, max_num_seqs, enable_prefix_caching, batch_invariant,
    seed, num_threads, tokenizer, chat_template.
    """

    def __init__(self, model: Optional[str] = None, **kwargs):
        self.args = EngineArgs.from_kwargs(model=model, **kwargs)
        self.llm_engine = LLMEngine(self.args)

    @property
    def model_path(self) -> str:
        return self.llm_engine.model_path

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True,
                 lora_request: Union[LoRARequest, Sequence[LoRARequest], None] = None) -> list[RequestOutput]:
        """Runs every prompt to completion (continuously batched); returns outputs in prompt order. lora_request:
        one LoRA adapter for every prompt, or one per prompt (None: the base model), as vLLM's."""
        prompts = _as_list(prompts)
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        loras = lora_request if isinstance(lora_request, (list, tuple)) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"got {len(loras)} LoRA requests for {len(prompts)} prompts")
        engine = self.llm_engine
        ids = []
        try:
            for p, sp, lora in zip(prompts, params, loras):
                ids.append(engine.add_request(None, p, sp or SamplingParams(), lora_request=lora))
            results: dict[str, RequestOutput] = {}
            bar = _progress(len(ids), use_tqdm)
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
            if bar is not None:
                bar.close()
        except BaseException:
            engine.abort_request(ids)  # an error or Ctrl-C leaves no half-run requests behind
            raise
        return [results[i] for i in ids]

    def embed(self, prompts: Union[PromptType, Sequence[PromptType]],
              pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None,
              use_tqdm: bool = True,
              lora_request: Union[LoRARequest, Sequence[LoRARequest], None] = None) -> list[EmbeddingRequestOutput]:
        """vLLM's LLM.embed: one embedding per prompt (a model loaded with runner="pooling")."""
        outs = self.generate(prompts, _pooling_list(prompts, pooling_params), use_tqdm=use_tqdm,
                             lora_request=lora_request)
        return [EmbeddingRequestOutput(o.request_id, EmbeddingOutput(o.pooled.tolist()), list(o.prompt_token_ids))
                for o in outs]

    def encode(self, prompts: Union[PromptType, Sequence[PromptType]],
               pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None, use_tqdm: bool = True,
               pooling_task: str = "embed",
               lora_request: Union[LoRARequest, Sequence[LoRARequest], None] = None) -> list[PoolingRequestOutput]:
        """vLLM's LLM.encode: the pooled data per prompt as a torch tensor (pooling_task "embed")."""
        import torch
        params = _pooling_list(prompts, pooling_params)
        for p in params:
            if p.task != pooling_task:
                p.task = pooling_task  # vLLM sets the request's task from pooling_task; PoolingParams checks it
                p.__post_init__()
        outs = self.generate(prompts, params, use_tqdm=use_tqdm, lora_request=lora_request)
        return [PoolingRequestOutput(o.request_id, PoolingOutput(torch.from_numpy(o.pooled)),
                                     list(o.prompt_token_ids)) for o in outs]

    def classify(self, prompts: Union[PromptType, Sequence[PromptType]], use_tqdm: bool = True,
                 lora_request: Union[LoRARequest, Sequence[LoRARequest], None] = None
                 ) -> list[ClassificationRequestOutput]:
        """vLLM's LLM.classify: the class probabilities of a sequence-classification model, per prompt."""
        outs = self.generate(prompts, [PoolingParams(task="classify") for _ in _as_list(prompts)], use_tqdm=use_tqdm,
                             lora_request=lora_request)
        return [ClassificationRequestOutput(o.request_id, ClassificationOutput(o.pooled.tolist()),
                                            list(o.prompt_token_ids)) for o in outs]

    def score(self, data_1: Union[PromptType, Sequence[PromptType]], data_2: Union[PromptType, Sequence[PromptType]],
              use_tqdm: bool = True, lora_request: Optional[LoRARequest] = None) -> list[ScoringRequestOutput]:
        """vLLM's LLM.score: one against many or pairwise (engine/pooling/score.py); an embedding model scores the
        cosine of the texts' vectors, a cross-encoder (one-label classifier) the texts joined."""
        first, second = _as_list(data_1), _as_list(data_2)
        pairs = pair_up(first, second)
        engine = self.llm_engine
        if is_cross_encoder(engine.pooling):
            tok, types = self.get_tokenizer(), engine.config.type_vocab_size
            prompts = [cross_encoder_input(tok, types, _text_or_ids(first[i]), _text_or_ids(second[j]))
                       for i, j in pairs]
            outs = self.classify(prompts, use_tqdm=use_tqdm, lora_request=lora_request)
            return [ScoringRequestOutput(o.request_id, ScoringOutput(float(o.outputs.probs[0])), list(o.prompt_token_ids))
                    for o in outs]
        vecs = self.embed(first + second, use_tqdm=use_tqdm, lora_request=lora_request)
        a, b = vecs[:len(first)], vecs[len(first):]
        return [ScoringRequestOutput(f"{a[i].request_id}-{b[j].request_id}",
                                     ScoringOutput(cosine(a[i].outputs.embedding, b[j].outputs.embedding)),
                                     a[i].prompt_token_ids + b[j].prompt_token_ids) for i, j in pairs]

    def generate_stream(self, prompt: PromptType, sampling_params: Optional[SamplingParams] = None,
                        lora_request: Optional[LoRARequest] = None) -> Iterator[RequestOutput]:
        """One prompt; yields its cumulative RequestOutput after every step that changed it."""
        engine = self.llm_engine
        rid = engine.add_request(None, prompt, sampling_params or SamplingParams(), lora_request=lora_request)
        try:
            done = False
            while not done:
                for out in engine.step():
                    if out.request_id == rid:
                        done = out.finished
                        yield out
        finally:
            engine.abort_request(rid)

    def chat(self, messages, sampling_params: Optional[SamplingParams] = None, use_tqdm: bool = True,
             chat_template: Optional[str] = None, add_generation_prompt: bool = True, tools=None,
             chat_template_kwargs: Optional[dict] = None,
             lora_request: Union[LoRARequest, Sequence[LoRARequest], None] = None) -> list[RequestOutput]:
        """messages: one conversation (list of {'role', 'content'}) or a list of them; tools (OpenAI function
        tools) and chat_template_kwargs (enable_thinking, ...) go to the chat template, as in vLLM."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self._chat_prompt(c, chat_template, add_generation_prompt, tools, chat_template_kwargs)
                   for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def _chat_prompt(self, conversation, chat_template=None, add_generation_prompt=True, tools=None,
                     template_kwargs=None) -> dict:
        """The rendered text and its ids (BOS once, as the template and the model want it)."""
        tok = self.get_tokenizer()
        kw = dict(template_kwargs or {}, add_generation_prompt=add_generation_prompt, chat_template=chat_template,
                  tools=tools)
        return {"prompt": tok.apply_chat_template(conversation, tokenize=False, **kw),
                "prompt_token_ids": tok.apply_chat_template(conversation, tokenize=True, **kw)}

    def chat_stream(self, messages, sampling_params: Optional[SamplingParams] = None,
                    chat_template: Optional[str] = None) -> Iterator[RequestOutput]:
        """One conversation; yields its cumulative RequestOutput after every step (streamed chat)."""
        return self.generate_stream(self._chat_prompt(messages, chat_template), sampling_params)

    def beam_search(self, prompts, params):
        """vLLM's LLM.beam_search: prompts (strings, token lists or dicts), BeamSearchParams ->
        one BeamSearchOutput per prompt whose sequences hold prompt + generated tokens, best first."""
        from engine.sample.beam_search import beam_search
        return beam_search(self, _as_list(prompts), params)


def _pooling_list(prompts, pooling_params) -> list[PoolingParams]:
    n = len(_as_list(prompts))
    if isinstance(pooling_params, (list, tuple)):
        return [p.clone() for p in pooling_params]
    return [(pooling_params or PoolingParams()).clone() for _ in range(n)]


def _as_list(prompts) -> list:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]
    return list(prompts)


def _progress(total: int, enabled: bool):
    if not enabled or total <= 1:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc="Processed prompts", unit="req")


def _text_or_ids(prompt):
    """A score's input as a text or a token-id list."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    if isinstance(prompt, dict) and "prompt" in prompt:
        return prompt["prompt"]
    if isinstance(prompt, (list, tuple)):
        return list(prompt)
    raise TypeError(f"a score's text must be a string, token ids or a prompt dict, got {type(prompt).__name__}")
