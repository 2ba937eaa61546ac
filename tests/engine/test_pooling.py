"""Pooling models (runner="pooling", engine/pooling/): LLM.embed, encode, score and classify on tiny random qwen3 and
llama models against transformers' final hidden states (last-token, mean and CLS pooling, normalized or not, from pooler_config
or the folder's sentence-transformers files); chunked prefill, batches, prefix-cache hits and Matryoshka dimensions;
the refusals (generation on a pooling model, embeddings on a generating one, dimensions the model was not trained
for)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine import LLM, PoolingParams, SamplingParams
from tests.model.tiny_models import saved_tiny

PROMPTS = [[int(t) for t in np.random.default_rng(i).integers(2, 256, n)] for i, n in enumerate((7, 30, 19, 1))]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf, _ = saved_tiny(folder, request.param)
    return str(folder), hf.float().eval()


def _reference(hf, ids, pooling="LAST", normalize=True):
    with torch.no_grad():
        h = hf.model(torch.tensor([ids])).last_hidden_state[0].double()
    v = {"LAST": h[-1], "MEAN": h.mean(0), "CLS": h[0]}[pooling]
    return (torch.nn.functional.normalize(v, dim=0) if normalize else v).numpy()


def _rel_err(a, b):
    return float(np.abs(np.asarray(a) - b).max() / np.abs(b).max())


def _embed(llm, prompts, params=None):
    return [np.array(o.outputs.embedding) for o in llm.embed([{"prompt_token_ids": p} for p in prompts], params,
                                                            use_tqdm=False)]


KW = dict(max_model_len=128, kv_cache_memory=0.05, dtype="float32", kv_cache_dtype="fp32", runner="pooling")


@pytest.mark.parametrize("pooling, normalize", [("LAST", True), ("MEAN", True), ("CLS", False), ("MEAN", False)])
def test_embeddings_match_transformers(tiny, pooling, normalize):
    folder, hf = tiny
    llm = LLM(model=folder, pooler_config={"pooling_type": pooling, "normalize": normalize}, **KW)
    got = _embed(llm, PROMPTS)
    for ids, v in zip(PROMPTS, got):
        assert v.shape == (hf.config.hidden_size,)
        assert _rel_err(v, _reference(hf, ids, pooling, normalize)) < 2e-3
    # each alone as in the batch, chunked prefill as whole, and a prompt read from the prefix cache as computed
    chunked = LLM(model=folder, pooler_config={"pooling_type": pooling, "normalize": normalize},
                  max_num_batched_tokens=8, **KW)
    for ids, v in zip(PROMPTS, got):
        np.testing.assert_allclose(_embed(llm, [ids])[0], v, rtol=0, atol=1e-5)
        for _ in range(2):  # the second time its first chunks' blocks are in the prefix cache
            np.testing.assert_allclose(_embed(chunked, [ids])[0], v, rtol=0, atol=1e-4)


def test_sentence_transformers_files_choose_the_pooling(tiny, tmp_path):
    folder, hf = tiny
    import shutil
    shutil.copytree(folder, tmp_path / "st", dirs_exist_ok=True)
    st = tmp_path / "st"
    (st / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (st / "1_Pooling").mkdir()
    (st / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    llm = LLM(model=str(st), **KW)
    assert _rel_err(_embed(llm, PROMPTS[1:2])[0], _reference(hf, PROMPTS[1], "MEAN", normalize=False)) < 2e-3
    # asked per request: normalized after all
    v = _embed(llm, PROMPTS[1:2], PoolingParams(normalize=True))[0]
    assert _rel_err(v, _reference(hf, PROMPTS[1], "MEAN", normalize=True)) < 2e-3


def test_matryoshka_dimensions(tiny, tmp_path):
    folder, hf = tiny
    import shutil
    shutil.copytree(folder, tmp_path / "m", dirs_exist_ok=True)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "matryoshka_dimensions": [64, 128]}))
    llm = LLM(model=str(tmp_path / "m"), **KW)
    v = _embed(llm, PROMPTS[:1], PoolingParams(dimensions=64))[0]
    with torch.no_grad():
        h = hf.model(torch.tensor([PROMPTS[0]])).last_hidden_state[0, -1, :64].double()
    assert v.shape == (64,) and _rel_err(v, torch.nn.functional.normalize(h, dim=0).numpy()) < 2e-3
    with pytest.raises(ValueError, match="matryoshka_dimensions"):
        llm.embed([{"prompt_token_ids": PROMPTS[0]}], PoolingParams(dimensions=100), use_tqdm=False)
    plain = LLM(model=folder, **KW)
    with pytest.raises(ValueError, match="does not support matryoshka"):
        plain.embed([{"prompt_token_ids": PROMPTS[0]}], PoolingParams(dimensions=64), use_tqdm=False)


def test_encode_gives_tensors_and_the_runners_refuse_each_others_requests(tiny):
    folder, hf = tiny
    llm = LLM(model=folder, **KW)
    out = llm.encode([{"prompt_token_ids": PROMPTS[0]}], use_tqdm=False)[0]
    assert isinstance(out.outputs.data, torch.Tensor)
    np.testing.assert_allclose(out.outputs.data.numpy(), _embed(llm, PROMPTS[:1])[0], atol=1e-6)
    with pytest.raises(ValueError, match="not supported"):
        llm.encode([{"prompt_token_ids": PROMPTS[0]}], pooling_task="token_classify", use_tqdm=False)
    with pytest.raises(ValueError, match="pooling model"):
        llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(max_tokens=2), use_tqdm=False)
    gen = LLM(model=folder, **{**KW, "runner": "generate"})
    with pytest.raises(ValueError, match="runner='pooling'"):
        gen.embed([{"prompt_token_ids": PROMPTS[0]}], use_tqdm=False)
    with pytest.raises(ValueError, match="pooler_config"):
        LLM(model=folder, **{**KW, "runner": "generate", "pooler_config": {"pooling_type": "MEAN"}})
    with pytest.raises(ValueError, match="pooling_type"):
        LLM(model=folder, **{**KW, "pooler_config": {"pooling_type": "MAX"}})


def test_a_pool_started_again_from_the_first_position_forgets_the_first_run():
    """A pooling request preempted and recomputed (its rows from position 0 again) pools each position once."""
    from engine.pooling.config import PoolerConfig
    from engine.pooling.pooler import PoolingState
    rows = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    pool = PoolingState(PoolerConfig(pooling_type="MEAN", normalize=False), PoolingParams())
    pool.add(0, rows[:6])  # preempted after its first chunk
    pool.add(0, rows[:4])
    pool.add(4, rows[4:])
    np.testing.assert_allclose(pool.result(), rows.mean(0), rtol=1e-6)


def test_score_is_the_cosine_of_the_two_vectors(tiny):
    folder, hf = tiny
    llm = LLM(model=folder, **KW)
    q, docs = {"prompt_token_ids": PROMPTS[0]}, [{"prompt_token_ids": p} for p in PROMPTS[1:]]
    ref = [_reference(hf, p) for p in PROMPTS]
    one_to_many = llm.score(q, docs, use_tqdm=False)
    assert [o.outputs.score for o in one_to_many] == pytest.approx([float(ref[0] @ r) for r in ref[1:]], abs=1e-4)
    pairwise = llm.score(docs, docs[::-1], use_tqdm=False)
    assert [o.outputs.score for o in pairwise] == pytest.approx(
        [float(ref[1 + i] @ ref[3 - i]) for i in range(3)], abs=1e-4)
    with pytest.raises(ValueError, match="give one text_1"):
        llm.score(docs[:2], docs, use_tqdm=False)


def test_classify_gives_the_heads_class_probabilities(tmp_path):
    """A Qwen3ForSequenceClassification checkpoint: its score head over the last token's state, softmaxed, as
    transformers computes it; an embedding model without a head refuses classify."""
    from tests.model.tiny_models import saved_tiny_classifier
    hf = saved_tiny_classifier(tmp_path)
    llm = LLM(model=str(tmp_path), **{**KW, "runner": "auto"})  # a classification checkpoint pools by default
    got = llm.classify([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    for ids, out in zip(PROMPTS, got):
        with torch.no_grad():
            want = torch.softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1).numpy()
        assert out.outputs.num_classes == 3 and _rel_err(out.outputs.probs, want) < 2e-3
    assert max(max(o.outputs.probs) for o in got) > 0.6
    saved_tiny(tmp_path / "embedder", "qwen3")
    with pytest.raises(ValueError, match="no classification head"):
        LLM(model=str(tmp_path / "embedder"), **KW).classify([{"prompt_token_ids": PROMPTS[0]}], use_tqdm=False)


def test_a_one_label_classifier_scores_pairs_as_a_cross_encoder(tmp_path):
    """A one-label sequence classifier (a reranker, a reward model): classify gives the sigmoid of its logit (softmax
    over one class would always be 1), and score joins the two texts and scores them together, as vLLM's cross-encoder
    scoring does: the sigmoid of transformers' logit over the joined tokens."""
    from tests.model.tiny_models import saved_tiny_classifier
    hf = saved_tiny_classifier(tmp_path, num_labels=1)
    llm = LLM(model=str(tmp_path), **{**KW, "runner": "auto"})
    query, docs = "t3 t4 t5", ["t9 t10", "t200", "t3 t4"]

    def want(ids):
        with torch.no_grad():
            return float(torch.sigmoid(hf(torch.tensor([ids])).logits[0, 0].double()))

    got = llm.score(query, docs, use_tqdm=False)
    for d, out in zip(docs, got):
        ids = [3, 4, 5] + [int(w[1:]) for w in d.split()]  # the tiny tokenizer: "tN" is token N, no specials
        assert out.prompt_token_ids == ids and abs(out.outputs.score - want(ids)) < 2e-3
    assert max(o.outputs.score for o in got) - min(o.outputs.score for o in got) > 0.05  # the pairs differ
    one = llm.classify({"prompt_token_ids": [3, 4]}, use_tqdm=False)[0].outputs.probs
    assert len(one) == 1 and abs(one[0] - want([3, 4])) < 2e-3


def test_hf_overrides_serve_a_causal_lm_as_a_two_way_reranker(tiny):
    """vLLM's Qwen3-Reranker recipe: hf_overrides turn a causal LM into a one-label classifier whose score is the
    second token's probability against the first at the last position (from_2_way_softmax), scoring pairs joined."""
    folder, hf = tiny
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["t5", "t9"],
                 "is_original_qwen3_reranker": True}
    llm = LLM(model=folder, **{**KW, "runner": "auto"}, hf_overrides=overrides)
    got = llm.score("t3 t4", ["t7", "t100 t101"], use_tqdm=False)
    for ids, out in zip([[3, 4, 7], [3, 4, 100, 101]], got):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1].double()
        want = float(torch.softmax(logits[[5, 9]], dim=0)[1])
        assert abs(out.outputs.score - want) < 2e-3
    for bad, words in (({"max_position_embeddings": 4}, "not supported"),
                       ({"classifier_from_token": ["t5", "t9"]}, "the only conversion"),
                       ({"classifier_from_token": ["t5", "nope"], "method": "from_2_way_softmax"}, "vocabulary")):
        with pytest.raises(ValueError, match=words):
            LLM(model=folder, **KW, hf_overrides=bad)
