"""LoRA adapters behind a real `ramlm serve --enable-lora --lora-modules ...` with the openai SDK: the request's model
picks the adapter (greedy tokens equal to PEFT's own generate), /v1/models lists adapters under their base model,
vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter change what is served; bad adapters get a 400 and change
nothing."""
from __future__ import annotations

import httpx
import openai
import pytest
import torch

from tests.engine.entrypoints.server.conftest import running_server
from tests.engine.lora.adapters import ATTENTION, EVERY, save_adapter
from tests.model.tiny_models import saved_tiny

PROMPT = [3, 17, 42, 99, 7]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_server")
    hf, _ = saved_tiny(root / "base", "qwen3")
    peft_a = save_adapter(hf, root / "a", EVERY, seed=1)
    peft_b = save_adapter(hf, root / "b", ATTENTION, seed=2)
    with running_server("--model", str(root / "base"), "--enable-lora", "--max-loras", "2",
                        "--lora-modules", f"alpha={root / 'a'}", "--dtype", "float32", "--kv-cache-dtype",
                        "fp32", env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as srv:
        with openai.OpenAI(base_url=srv.base_url + "/v1", api_key=srv.api_key, max_retries=0, timeout=60) as c:
            yield srv, c, root, hf, peft_a, peft_b


@torch.no_grad()
def _greedy(model, n: int) -> list[int]:
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


def _completion(client, model: str) -> list[int]:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=0,
                                  extra_body={"ignore_eos": True})
    return [int(t[1:]) for t in r.choices[0].logprobs.tokens]  # the tiny tokenizer's "tN" is token N


def _post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.base_url + path, json=body, headers={"Authorization": f"Bearer {srv.api_key}"}, timeout=60)


def test_model_field_picks_the_adapter(served):
    srv, client, root, hf, peft_a, _ = served
    got = _completion(client, "alpha")
    assert got == _greedy(peft_a, 6)
    assert _completion(client, srv.model) == _greedy(hf, 6) != got
    cards = {m.id: m for m in client.models.list().data}
    assert cards["alpha"].parent == srv.model and cards["alpha"].root == str(root / "a")


def test_load_and_unload_at_runtime(served):
    srv, client, root, hf, _, peft_b = served
    r = _post(srv, "/v1/load_lora_adapter", {"lora_name": "beta", "lora_path": str(root / "b")})
    assert r.status_code == 200 and "beta" in r.text
    assert _completion(client, "beta") == _greedy(peft_b, 6)
    assert "beta" in {m.id for m in client.models.list().data}
    again = _post(srv, "/v1/load_lora_adapter", {"lora_name": "beta", "lora_path": str(root / "b")})
    assert again.status_code == 400 and "already been loaded" in again.text
    r = _post(srv, "/v1/unload_lora_adapter", {"lora_name": "beta"})
    assert r.status_code == 200
    with pytest.raises(openai.NotFoundError):
        _completion(client, "beta")
    assert _post(srv, "/v1/unload_lora_adapter", {"lora_name": "beta"}).status_code == 404


def test_bad_adapters_get_400_and_change_nothing(served, tmp_path):
    srv, client, root, hf, peft_a, _ = served
    save_adapter(hf, tmp_path / "big", ATTENTION, seed=3, r=32)  # above max_lora_rank (16)
    for path, words in ((tmp_path / "big", "max_lora_rank"), (tmp_path / "nothing", "does not exist")):
        r = _post(srv, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(path)})
        assert r.status_code == 400 and words in r.json()["error"]["message"]
    assert "bad" not in {m.id for m in client.models.list().data}
    assert _completion(client, "alpha") == _greedy(peft_a, 6)


def test_runtime_updating_is_off_unless_asked(server):
    """Without VLLM_ALLOW_RUNTIME_LORA_UPDATING the endpoints answer 404, as vLLM (which does not register them)."""
    r = _post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/nonexistent"})
    assert r.status_code == 404 and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in r.json()["error"]["message"]
