"""/v1/embeddings with the openai SDK against a real `ramlm serve --runner pooling` of a tiny random qwen3 model:
vectors equal to transformers' (the SDK's default base64 and plain floats alike), token-id inputs, truncation,
usage; 400s for what cannot be served (dimensions of a model without Matryoshka training, empty input), and the
generating server's answer to an embeddings request."""
from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
import torch

from tests.engine.entrypoints.server.conftest import running_server
from tests.model.tiny_models import saved_tiny


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embedder")
    hf, _ = saved_tiny(folder, "qwen3")
    with running_server("--model", str(folder), "--runner", "pooling", "--max-model-len", "128",
                        "--dtype", "float32", "--kv-cache-dtype", "fp32") as srv:
        with openai.OpenAI(base_url=srv.base_url + "/v1", api_key=srv.api_key, max_retries=0, timeout=60) as c:
            yield srv, c, hf.float().eval()


def _reference(hf, ids):
    with torch.no_grad():
        h = hf.model(torch.tensor([ids])).last_hidden_state[0, -1].double()
    return torch.nn.functional.normalize(h, dim=0).numpy()


def _rel_err(a, b):
    return float(np.abs(np.asarray(a) - b).max() / np.abs(b).max())


def test_embeddings_match_transformers_in_both_encodings(embedder):
    srv, client, hf = embedder
    texts = ["t3 t4 t5 t6", "t9 t9 t10", "t200"]
    b64 = client.embeddings.create(model=srv.model, input=texts)  # the SDK asks for base64 and decodes it
    floats = client.embeddings.create(model=srv.model, input=texts, encoding_format="float")
    ids = [[int(w[1:]) for w in t.split()] for t in texts]  # the tiny tokenizer: "tN" is token N, no specials
    assert [d.index for d in b64.data] == [0, 1, 2] and b64.model == srv.model
    assert b64.usage.prompt_tokens == b64.usage.total_tokens == sum(len(i) for i in ids)
    for d64, df, i in zip(b64.data, floats.data, ids):
        np.testing.assert_array_equal(np.asarray(d64.embedding, np.float32), np.asarray(df.embedding, np.float32))
        assert _rel_err(df.embedding, _reference(hf, i)) < 2e-3


def test_token_ids_and_truncation(embedder):
    srv, client, hf = embedder
    ids = [5, 6, 7, 8, 9, 10]
    one = client.embeddings.create(model=srv.model, input=ids, encoding_format="float")
    assert _rel_err(one.data[0].embedding, _reference(hf, ids)) < 2e-3
    cut = client.embeddings.create(model=srv.model, input=[ids, ids[:2]], encoding_format="float",
                                   extra_body={"truncate_prompt_tokens": 3})
    assert _rel_err(cut.data[0].embedding, _reference(hf, ids[-3:])) < 2e-3
    assert cut.usage.prompt_tokens == 5


def test_what_cannot_be_served_is_a_400(embedder):
    srv, client, _ = embedder
    with pytest.raises(openai.BadRequestError, match="matryoshka"):
        client.embeddings.create(model=srv.model, input="t1 t2", dimensions=16)
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.embeddings.create(model=srv.model, input=[])
    with pytest.raises(openai.BadRequestError, match="pooling model"):
        client.completions.create(model=srv.model, prompt="t1 t2", max_tokens=2)
    ok = client.embeddings.create(model=srv.model, input="t1 t2", encoding_format="float")  # still serving
    assert len(ok.data[0].embedding) == 256


def test_pooling_endpoint_gives_the_vectors(embedder):
    """vLLM's /pooling: an embedding model's pooled vectors as they are, floats or base64."""
    srv, client, hf = embedder
    with srv.client() as http:
        body = http.post("/pooling", json={"model": srv.model, "input": ["t3 t4 t5 t6", "t200"]}).json()
        b64 = http.post("/pooling", json={"model": srv.model, "input": "t200", "encoding_format": "base64"}).json()
        bad = http.post("/pooling", json={"model": srv.model, "input": "t3", "task": "classify"})
    assert body["object"] == "list" and body["id"].startswith("pool-") and body["usage"]["prompt_tokens"] == 5
    for d, ids in zip(body["data"], [[3, 4, 5, 6], [200]]):
        assert d["object"] == "pooling" and _rel_err(d["data"], _reference(hf, ids)) < 2e-3
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["data"]), "<f4")
    np.testing.assert_array_equal(decoded, np.asarray(body["data"][1]["data"], np.float32))
    assert bad.status_code == 400 and "classification head" in bad.json()["error"]["message"]


def test_a_generating_model_refuses_embeddings(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0, timeout=60) as c:
        with pytest.raises(openai.BadRequestError, match="runner='pooling'"):
            c.embeddings.create(model=server.model, input="hello")


def test_score_and_rerank_are_cosines_of_the_vectors(embedder):
    srv, _, hf = embedder
    texts = ["t3 t4 t5", "t3 t4 t6", "t100 t101", "t3 t4 t5 t5"]
    ref = [_reference(hf, [int(w[1:]) for w in t.split()]) for t in texts]
    with srv.client() as http:
        score = http.post("/v1/score", json={"model": srv.model, "text_1": texts[0], "text_2": texts[1:]}).json()
        assert [d["score"] for d in score["data"]] == pytest.approx([float(ref[0] @ r) for r in ref[1:]], abs=1e-4)
        assert score["usage"]["prompt_tokens"] == 3 + 3 + 2 + 4
        rr = http.post("/v1/rerank", json={"model": srv.model, "query": texts[0], "documents": texts[1:],
                                           "top_n": 2}).json()
        want = sorted(range(3), key=lambda i: -float(ref[0] @ ref[1 + i]))[:2]
        assert [r["index"] for r in rr["results"]] == want
        assert rr["results"][0]["document"]["text"] == texts[1 + want[0]]
        assert rr["results"][0]["relevance_score"] == pytest.approx(float(ref[0] @ ref[1 + want[0]]), abs=1e-4)
        bad = http.post("/score", json={"model": srv.model, "text_1": texts[:2], "text_2": texts[1:]})
        assert bad.status_code == 400 and "text_1" in bad.json()["error"]["message"]
        assert http.post("/rerank", json={"model": srv.model, "query": "t1", "documents": []}).status_code == 400


def test_classify_names_the_likeliest_class(tmp_path_factory):
    from tests.model.tiny_models import saved_tiny_classifier
    folder = tmp_path_factory.mktemp("classifier")
    hf = saved_tiny_classifier(folder)
    with running_server("--model", str(folder), "--runner", "pooling", "--max-model-len", "128", "--dtype", "float32",
                        "--kv-cache-dtype", "fp32") as srv, srv.client() as http:
        body = http.post("/classify", json={"model": srv.model, "input": ["t3 t4 t5", "t9"]}).json()
        for d, ids in zip(body["data"], [[3, 4, 5], [9]]):
            with torch.no_grad():
                want = torch.softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1).numpy()
            assert d["num_classes"] == 3 and _rel_err(d["probs"], want) < 2e-3
            assert d["label"] == f"class_{int(np.argmax(want))}"
        assert body["usage"]["prompt_tokens"] == 4
        pooled = http.post("/pooling", json={"model": srv.model, "input": "t3 t4 t5"}).json()  # the model's task
        assert pooled["data"][0]["object"] == "pooling"
        np.testing.assert_allclose(pooled["data"][0]["data"], body["data"][0]["probs"], rtol=1e-6)


def test_a_cross_encoder_scores_and_reranks_joined_pairs(tmp_path_factory):
    """/score and /rerank with a one-label classifier score each pair joined (vLLM's cross-encoder scoring)."""
    from tests.model.tiny_models import saved_tiny_classifier
    folder = tmp_path_factory.mktemp("reranker")
    hf = saved_tiny_classifier(folder, num_labels=1)

    def want(ids):
        with torch.no_grad():
            return float(torch.sigmoid(hf(torch.tensor([ids])).logits[0, 0].double()))

    with running_server("--model", str(folder), "--max-model-len", "128", "--dtype", "float32",
                        "--kv-cache-dtype", "fp32") as srv, srv.client() as http:
        score = http.post("/score", json={"model": srv.model, "text_1": "t3 t4", "text_2": ["t9", "t7 t8"]}).json()
        rerank = http.post("/rerank", json={"model": srv.model, "query": "t3 t4", "documents": ["t9", "t7 t8"]}).json()
    wants = [want([3, 4, 9]), want([3, 4, 7, 8])]
    assert [abs(d["score"] - w) < 2e-3 for d, w in zip(score["data"], wants)] == [True, True]
    assert [r["index"] for r in rerank["results"]] == sorted([0, 1], key=lambda i: -wants[i])
    assert all(abs(r["relevance_score"] - wants[r["index"]]) < 2e-3 for r in rerank["results"])
    assert score["usage"]["prompt_tokens"] == 7
