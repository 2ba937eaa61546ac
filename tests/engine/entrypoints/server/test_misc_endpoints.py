"""/health, /version, /tokenize, /detokenize (/metrics: test_metrics_exposition.py)."""
from __future__ import annotations

import httpx

import engine
from tests.engine.entrypoints.server.conftest import MAX_MODEL_LEN, MODEL


def test_health_and_version(server):
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    assert httpx.get(server.base_url + "/version", timeout=10).json() == {"version": engine.__version__}


def test_tokenize_detokenize_round_trip(http):
    r = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello world", "return_token_strs": True}).json()
    assert r["count"] == len(r["tokens"]) == 3 and r["max_model_len"] == MAX_MODEL_LEN
    assert r["token_strs"][0] == "<bos>" and r["token_strs"][1] == "Hello"
    bare = http.post("/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}).json()
    assert bare["tokens"] == r["tokens"][1:] and bare["token_strs"] is None
    assert http.post("/detokenize", json={"tokens": bare["tokens"]}).json() == {"prompt": "Hello world"}
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == "<bos>Hello world"


def test_tokenize_messages_uses_the_chat_template(http):
    r = http.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}],
                                     "return_token_strs": True}).json()
    strs = r["token_strs"]
    assert strs[0] == "<bos>" and "<start_of_turn>" in strs and strs[-2:] == ["model", "\n"]
