"""/v1/models, /v1/completions and /v1/chat/completions through the official openai SDK."""
from __future__ import annotations

import json

import pytest

from tests.engine.entrypoints.server.conftest import ALIAS, MAX_MODEL_LEN, MODEL

openai = pytest.importorskip("openai")

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0, timeout=60) as c:
        yield c


def test_models_lists_the_served_names(client, http):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL, ALIAS]
    card = http.get("/v1/models").json()["data"][0]
    assert card["max_model_len"] == MAX_MODEL_LEN and card["owned_by"] == "ramlm"


def test_completion_plain_and_streamed_agree(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0.0)
    plain = client.completions.create(**kw)
    choice = plain.choices[0]
    assert plain.object == "text_completion" and plain.model == MODEL
    assert choice.text and choice.finish_reason in ("length", "stop")
    assert plain.usage.prompt_tokens == 6 and 1 <= plain.usage.completion_tokens <= 8
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens

    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == choice.text
    assert finish == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_completion_alias_name_and_token_id_prompts(client, http):
    ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    a = client.completions.create(model=ALIAS, prompt=ids, max_tokens=4, temperature=0.0)
    b = client.completions.create(model=MODEL, prompt=[ids, ids], max_tokens=4, temperature=0.0)
    assert a.model == ALIAS
    assert [c.index for c in b.choices] == [0, 1]
    assert b.choices[0].text == b.choices[1].text == a.choices[0].text
    assert b.usage.prompt_tokens == 2 * len(ids)


def test_completion_list_of_strings_n_and_seed(client):
    out = client.completions.create(model=MODEL, prompt=["Hello", "Goodbye"], n=2, max_tokens=4, temperature=1.0,
                                    seed=7)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    again = client.completions.create(model=MODEL, prompt=["Hello", "Goodbye"], n=2, max_tokens=4,
                                      temperature=1.0, seed=7)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]  # seeded: reproducible


def test_completion_legacy_logprobs(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0.0, logprobs=2)
    lp = out.choices[0].logprobs
    n = out.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert all(x <= 0 for x in lp.token_logprobs)
    for tok, tlp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 2 <= len(top) <= 3 and top[tok] == tlp  # greedy: the chosen token is the best one
        assert max(top.values()) == tlp
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert "".join(lp.tokens).startswith(out.choices[0].text[:1])


def test_completion_echo_with_logprobs(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0.0, echo=True,
                                    logprobs=1)
    c = out.choices[0]
    assert c.text.startswith(PROMPT) and len(c.text) > len(PROMPT)
    lp = c.logprobs
    assert len(lp.tokens) == out.usage.prompt_tokens + out.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])


def test_completion_streamed_logprobs_and_echo(client):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0.0,
                                            logprobs=1, echo=True, stream=True))
    text = "".join(c.choices[0].text for c in chunks)
    assert text.startswith(PROMPT)
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert len(tokens) == 6 + 4


def test_completion_stop_string(client):
    base = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0.0).choices[0].text
    words = base.split()
    assert len(words) >= 2
    stop = " " + words[1]
    cut = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0.0, stop=[stop])
    c = cut.choices[0]
    assert c.finish_reason == "stop" and stop not in c.text and base.startswith(c.text)
    assert c.model_extra.get("stop_reason") == stop


def test_completion_vllm_extras(client, http):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0.8,
                                    extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2,
                                                "ignore_eos": True, "min_tokens": 6, "skip_special_tokens": False,
                                                "include_stop_str_in_output": True})
    assert out.usage.completion_tokens == 6 and out.choices[0].finish_reason == "length"
    # stop_token_ids: stop on the greedy second token; the stop token is not in the text.
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0.0, logprobs=0)
    first, second = greedy.choices[0].logprobs.tokens
    ids = http.post("/tokenize", json={"prompt": second, "add_special_tokens": False}).json()["tokens"]
    assert len(ids) == 1
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0.0,
                                    extra_body={"stop_token_ids": ids})
    c = out.choices[0]
    assert c.finish_reason == "stop" and c.model_extra["stop_reason"] == ids[0]
    assert c.text == first and out.usage.completion_tokens == 2


def test_chat_plain_and_streamed(client):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
    plain = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0.0)
    c = plain.choices[0]
    assert plain.object == "chat.completion" and c.message.role == "assistant"
    assert c.finish_reason in ("stop", "length") and c.message.content is not None
    assert plain.usage.completion_tokens <= 8 and plain.usage.prompt_tokens > 5

    stream = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0.0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == \
        [c.finish_reason]
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens


def test_chat_content_parts_max_completion_tokens_and_history(client):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Count: "}, {"type": "text", "text": "1 2 3"}]},
            {"role": "assistant", "content": "4 5"},
            {"role": "user", "content": "Go on."}]
    out = client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=3, max_tokens=10,
                                         temperature=0.0, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3 and out.choices[0].finish_reason == "length"


def test_chat_logprobs_plain_and_streamed(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0.0,
              logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    out = client.chat.completions.create(**kw)
    content = out.choices[0].logprobs.content
    assert len(content) == 4
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob == e.logprob  # greedy takes the best
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    streamed = [e for ch in client.chat.completions.create(**kw, stream=True)
                if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_raw_sse_framing(http):
    with http.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 3,
                                                      "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    for ln in lines[:-1]:
        assert ln.startswith("data: ")
        json.loads(ln[6:])
