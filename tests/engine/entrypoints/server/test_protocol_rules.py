"""vLLM's protocol rules: stream_options needs stream, /tokenize honours continue_final_message, any chat role
goes to the template (which decides)."""
from __future__ import annotations

import openai
import pytest

from tests.engine.entrypoints.server.conftest import MODEL

HI = [{"role": "user", "content": "Hi"}]
PREFILL = HI + [{"role": "assistant", "content": "Hello! My name is"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0, timeout=60)


def test_stream_options_without_stream_is_400(client, http):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, stream=False,
                                       stream_options={"include_usage": True})
    assert "Stream options can only be defined when `stream=True`" in e.value.message
    assert e.value.body["param"] == "stream_options"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, stream_options={"include_usage": True})
    assert "`stream=True`" in e.value.message
    # As in vLLM an empty object passes, and so does null.
    for options in ({}, None):
        r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "stream_options": options})
        assert r.status_code == 200, r.text


def test_stream_options_include_usage_by_default(client):
    kw = dict(model=MODEL, messages=HI, max_tokens=2, stream=True)
    with_options = list(client.chat.completions.create(**kw, stream_options={}))
    assert with_options[-1].choices == [] and with_options[-1].usage.completion_tokens == 2  # as in vLLM
    without = list(client.chat.completions.create(**kw))
    assert all(chunk.usage is None for chunk in without)
    off = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, stream=True,
                                         stream_options={"include_usage": False}))
    assert all(chunk.usage is None for chunk in off)


def _tokenize(http, **body) -> dict:
    r = http.post("/tokenize", json={"model": MODEL, "return_token_strs": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_tokenize_continue_final_message(http):
    closed = _tokenize(http, messages=PREFILL, add_generation_prompt=False)
    cont = _tokenize(http, messages=PREFILL, add_generation_prompt=False, continue_final_message=True)
    # The turn stays open: no <end_of_turn> and newline after the assistant's text.
    assert closed["token_strs"][-2:] == ["<end_of_turn>", "\n"]
    assert cont["tokens"] == closed["tokens"][:-2]
    text = http.post("/detokenize", json={"tokens": cont["tokens"]}).json()["prompt"]
    assert text.endswith("<start_of_turn>model\nHello! My name is")
    # The same prompt a chat completion continues (its usage counts it).
    r = http.post("/v1/chat/completions", json={"messages": PREFILL, "max_tokens": 1, "temperature": 0.0,
                                                "add_generation_prompt": False, "continue_final_message": True})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == cont["count"]


@pytest.mark.parametrize("path,extra", [("/tokenize", {}), ("/v1/chat/completions", {"max_tokens": 1})])
@pytest.mark.parametrize("flags", [{"continue_final_message": True},
                                   {"continue_final_message": True, "add_generation_prompt": True}])
def test_continue_final_message_with_generation_prompt_is_400(http, path, extra, flags):
    r = http.post(path, json={"messages": PREFILL, **extra, **flags})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "Cannot set both `continue_final_message` and `add_generation_prompt` to True." in err["message"]
    assert err["param"] == "continue_final_message"


def test_custom_role_goes_to_the_template(client, http):
    msgs = HI + [{"role": "critic", "content": "Be shorter."}]
    strs = _tokenize(http, messages=msgs)["token_strs"]
    assert "critic" in strs  # gemma's template writes other roles' names as they are
    reply = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, temperature=0.0)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_role_the_template_rejects_is_400(client):
    # Gemma's template raises unless turns alternate, starting with the user's.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}], max_tokens=2)
    assert "the chat template rejected the messages" in e.value.message
    assert "Conversation roles must alternate" in e.value.message
