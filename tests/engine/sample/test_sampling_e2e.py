"""Sampling through the whole engine on gemma-3-270m: seeds, n, stop strings, chat, beam search."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.sample.beam_search import BeamSearchParams


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=512, kv_cache_memory=0.25)


def test_seeded_sample_is_the_same_whatever_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, seed=1234)
    alone = llm.generate("Tell me a story about", seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=8)
    batch = llm.generate(["Hello", "Tell me a story about", "Numbers: 1, 2,"], [others, seeded, others],
                         use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone


def test_n_gives_n_distinct_reproducible_samples(llm):
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=7)
    out = llm.generate("My favourite animal is", params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    samples = [tuple(c.token_ids) for c in out.outputs]
    assert len(set(samples)) > 1
    again = llm.generate("My favourite animal is", params, use_tqdm=False)[0]
    assert [tuple(c.token_ids) for c in again.outputs] == samples


def test_stop_string_cuts_exactly(llm):
    base = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=20),
                        use_tqdm=False)[0].outputs[0].text
    assert "France" in base
    stop = "France"
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=20, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert out.text == base[: base.index(stop)] and out.finish_reason == "stop" and out.stop_reason == stop
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=20, stop=[stop],
                                                                  include_stop_str_in_output=True),
                       use_tqdm=False)[0].outputs[0]
    assert out.text == base[: base.index(stop) + len(stop)]


def test_chat_uses_the_gemma_template(llm):
    out = llm.chat([{"role": "user", "content": "Say hello."}], SamplingParams(temperature=0, max_tokens=8),
                   use_tqdm=False)[0]
    assert out.prompt.startswith("<bos><start_of_turn>user\nSay hello.<end_of_turn>\n<start_of_turn>model\n")
    assert out.prompt_token_ids.count(llm.get_tokenizer().bos_token_id) == 1
    assert out.outputs[0].text


def test_chat_passes_tools_and_template_kwargs(llm):
    """vLLM's LLM.chat(tools=..., chat_template_kwargs=...): both reach the template."""
    template = ("{% for t in tools %}[{{ t.function.name }}]{% endfor %}{{ flavour }}"
                "{% for m in messages %}{{ m.content }}{% endfor %}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    out = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False,
                   chat_template=template, tools=tools, chat_template_kwargs={"flavour": "mint"})[0]
    assert out.prompt == "[get_weather]mintHi"


def test_beam_search_best_beam_scores_at_least_greedy(llm):
    prompt = "The capital of France is"
    greedy = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=5, logprobs=0), use_tqdm=False)[0]
    res = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True))[0]
    assert len(res.sequences) == 3
    best = res.sequences[0]
    assert best.cum_logprob >= greedy.outputs[0].cumulative_logprob - 1e-4
    assert all(len(s.tokens) > len(greedy.prompt_token_ids) for s in res.sequences)


def test_chat_stream_ends_with_the_same_text_as_chat(llm):
    msgs = [{"role": "user", "content": "Name a colour."}]
    params = SamplingParams(temperature=0, max_tokens=6)
    streamed = list(llm.chat_stream(msgs, params))
    assert streamed[-1].finished
    assert streamed[-1].outputs[0].text == llm.chat(msgs, params, use_tqdm=False)[0].outputs[0].text


def test_engine_stats_and_request_metrics(llm):
    out = llm.generate("Count: one, two,", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
    m = out.metrics
    assert m.first_token_time >= m.first_scheduled_time >= m.arrival_time and m.time_in_queue >= 0
    stats = llm.llm_engine.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0 and 0.0 <= stats.kv_cache_usage <= 1.0
