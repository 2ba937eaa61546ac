"""Beam search the way vLLM's LLM.beam_search runs it: every step asks the engine for one token per
beam with 2 x beam_width logprobs, keeps the best beam_width continuations by cumulative logprob, and
lets the prefix cache carry each beam's shared KV from step to step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from engine.sample.sampling import SamplingParams


@dataclass
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self):
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be at least 1, got {self.beam_width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")


@dataclass
class BeamSearchSequence:
    tokens: list[int]
    logprobs: list[dict] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: Optional[str] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[object] = None


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]


def sort_key(seq: BeamSearchSequence, prompt_len: int, eos_ids, length_penalty: float) -> float:
    """vLLM's length-penalized score: cum_logprob / len ** length_penalty (EOS not counted)."""
    n = len(seq.tokens) - prompt_len
    if seq.tokens and seq.tokens[-1] in eos_ids:
        n -= 1
    return seq.cum_logprob / (max(n, 1) ** length_penalty)


def beam_search(llm, prompts, params: BeamSearchParams) -> list[BeamSearchOutput]:
    tok = llm.get_tokenizer()
    eos = set(tok.eos_token_ids)
    step_params = SamplingParams(max_tokens=1, logprobs=2 * params.beam_width, temperature=params.temperature)
    results = []
    for prompt in prompts:
        _, ids = llm.llm_engine.encode_prompt(prompt)
        plen = len(ids)
        beams = [BeamSearchSequence(list(ids))]
        done: list[BeamSearchSequence] = []
        for _ in range(params.max_tokens):
            outs = llm.generate([{"prompt_token_ids": b.tokens} for b in beams], step_params, use_tqdm=False)
            candidates = []
            for beam, out in zip(beams, outs):
                for tid, lp in out.outputs[0].logprobs[0].items():
                    candidates.append(BeamSearchSequence(beam.tokens + [tid], beam.logprobs + [{tid: lp}],
                                                         beam.cum_logprob + lp.logprob))
            candidates.sort(key=lambda s: s.cum_logprob, reverse=True)
            beams = []
            for cand in candidates[: params.beam_width]:
                if cand.tokens[-1] in eos and not params.ignore_eos:
                    cand.finish_reason = "stop"
                    done.append(cand)
                else:
                    beams.append(cand)
            if not beams:
                break
        for b in beams:
            b.finish_reason = b.finish_reason or "length"
        final = sorted(done + beams, key=lambda s: sort_key(s, plen, eos, params.length_penalty),
                       reverse=True)[: params.beam_width]
        for s in final:
            s.text = tok.decode(s.tokens[plen:])
        results.append(BeamSearchOutput(final))
    return results
