"""Structured outputs through the server and the official openai SDK: chat.completions.parse with pydantic models
(response_format json_schema, strict), json_object, vLLM's structured_outputs field on chat and completions, and
400s that name the problem while the server keeps serving."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.engine.entrypoints.server.conftest import MODEL
from tests.engine.structured_schemas import MODELS, prompt_for

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0, timeout=120) as c:
        yield c


def _parse(client, model):
    return client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": prompt_for(model)}],
                                         response_format=model, temperature=0, max_tokens=200)


def test_parse_returns_valid_instances_for_every_schema(client):
    with ThreadPoolExecutor(8) as pool:  # concurrent requests: constrained rows batched together
        results = list(pool.map(lambda m: _parse(client, m), MODELS))
    for model, r in zip(MODELS, results):
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "stop", (model.__name__, msg.content)
        assert isinstance(msg.parsed, model), (model.__name__, msg.content)


def test_json_object_and_structured_outputs_fields(client):
    ask = 'Reply with a JSON object with the key "ok" set to true.'
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ask}],
                                       response_format={"type": "json_object"}, temperature=0, max_tokens=100)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Yes or no?"}],
                                       extra_body={"structured_outputs": {"choice": ["yes", "no"]}}, temperature=0,
                                       max_tokens=10)
    assert r.choices[0].message.content in ("yes", "no")
    r = client.completions.create(model=MODEL, prompt="A code:", temperature=0, max_tokens=20,
                                  extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{3}"}})
    assert re.fullmatch("[A-Z]{3}-[0-9]{3}", r.choices[0].text)


def test_streamed_constrained_output_equals_the_plain_one(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": prompt_for(MODELS[0])}], temperature=0,
              max_tokens=200, response_format={"type": "json_schema", "json_schema": {
                  "name": "person", "schema": MODELS[0].model_json_schema(), "strict": True}})
    plain = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert streamed == plain
    MODELS[0].model_validate_json(plain)


@pytest.mark.parametrize("body,param,message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "structured_outputs", "objectx"),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs", "structured_outputs.regex"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs", "exactly one of"),
    ({"structured_outputs": {"choice": ["a"], "colour": 1}}, "structured_outputs", "has no field colour"),
    ({"structured_outputs": {"structural_tag": {"type": "structural_tag", "structures": [{"begin": "<a>"}],
                                                "triggers": ["<a"]}}}, "structured_outputs",
     "structured_outputs.structural_tag"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     "response_format.json_schema.schema is required"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "response_format",
     "cannot both constrain"),
])
def test_bad_constraints_get_a_400_naming_them(server, body, param, message):
    with server.client() as http:
        r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": 5, **body})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert message in err["message"] and err["param"] == param, err
        ok = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 3,
                                                     "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200  # the server goes on serving
    assert server.wait_idle()["ramlm:num_requests_running"] == 0
