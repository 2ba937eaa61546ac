"""BERT-family encoders served as vLLM serves them, against transformers on tiny random models with a real WordPiece
tokenizer: LLM.embed (CLS pooling by default, mean through sentence-transformers' modules, normalized), classify
with BERT's pooler and classifier (and RoBERTa's head), cross-encoder scores over the tokenizer's pair template
with its token types (in LLM.score and the server's /score and /rerank), token_type_ids prompts checked; the openai
SDK's embeddings against `ramlm serve` of a BERT folder."""
from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
import torch
import transformers

from engine import LLM
from tests.engine.entrypoints.server.conftest import running_server
from tests.model.test_bert import tiny_encoder

KW = dict(max_model_len=64, kv_cache_memory=0.05, dtype="float32", kv_cache_dtype="fp32")
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "away", "##s", "##ing", "a", "big", "red", "house"]
TEXTS = ["the cat sat on the mat", "a big red house", "dogs running far away"]


def save_wordpiece(folder) -> transformers.PreTrainedTokenizerFast:
    """A BERT WordPiece tokenizer (uncased, [CLS] a [SEP] b [SEP]) of 256 entries, saved beside a model."""
    from tokenizers import BertWordPieceTokenizer
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    vocab += [f"w{i}" for i in range(256 - len(vocab))]
    wp = BertWordPieceTokenizer({t: i for i, t in enumerate(vocab)}, lowercase=True)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=wp, unk_token="[UNK]", sep_token="[SEP]",
                                               pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]",
                                               model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    tok.save_pretrained(folder)
    assert tok("the cats")["input_ids"] == [2, 5, 6, 14, 3]  # [CLS] the cat ##s [SEP]
    return tok


def saved(folder, cls=transformers.AutoModel, **cfg):
    hf = tiny_encoder("bert", cls, **cfg)
    hf.save_pretrained(folder, safe_serialization=True)
    return hf, save_wordpiece(folder)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert")
    hf, tok = saved(folder)
    return folder, hf, tok


def _hidden(hf, tok, text):
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        return hf(**enc).last_hidden_state[0].double()


def test_embeddings_pool_the_cls_row_by_default(bert):
    folder, hf, tok = bert
    llm = LLM(model=str(folder), **KW)  # runner auto: an encoder pools
    assert llm.get_tokenizer().encode(TEXTS[2]) == tok(TEXTS[2])["input_ids"]  # the same WordPiece ids
    for text, out in zip(TEXTS, llm.embed(TEXTS, use_tqdm=False)):
        want = torch.nn.functional.normalize(_hidden(hf, tok, text)[0], dim=0).numpy()
        assert np.abs(np.asarray(out.outputs.embedding) - want).max() < 2e-3
    with pytest.raises(ValueError, match="bidirectionally"):
        LLM(model=str(folder), runner="generate", **KW)


def test_an_encoder_attends_over_its_own_step_whatever_the_kv_cache_dtype(bert):
    """An encoder's K/V never go through the paged cache (its prompt runs whole and is never reused), so a
    quantized cache dtype changes nothing, long prompts included (the bf16 prefill path)."""
    folder, _hf, _tok = bert
    texts = TEXTS + [" ".join(WORDS[:9] * 5)]  # 47 tokens: a long chunk
    kw = {**KW, "dtype": "auto"}
    want = [o.outputs.embedding for o in LLM(model=str(folder), **{**kw, "kv_cache_dtype": "fp32"}).embed(
        texts, use_tqdm=False)]
    for dtype in ("int8",):
        got = LLM(model=str(folder), **{**kw, "kv_cache_dtype": dtype}).embed(texts, use_tqdm=False)
        assert [o.outputs.embedding for o in got] == want


def test_sentence_transformers_mean_pooling(tmp_path):
    hf, tok = saved(tmp_path)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    llm = LLM(model=str(tmp_path), **KW)
    for text, out in zip(TEXTS, llm.embed(TEXTS, use_tqdm=False)):
        want = torch.nn.functional.normalize(_hidden(hf, tok, text).mean(dim=0), dim=0).numpy()
        assert np.abs(np.asarray(out.outputs.embedding) - want).max() < 2e-3


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_a_gguf_in_llama_cpps_layout_embeds_with_its_wordpiece_and_pooling(bert, tmp_path, qtype):
    """A BERT GGUF with the tokenizer keys llama.cpp's converter writes (phantom-space WordPiece) and its pooling_type:
    the same ids as transformers' tokenizer (single texts and pairs with their types), MEAN pooling read from the
    file, the vectors of transformers (Q8_0 within its rounding)."""
    import dataclasses

    import gguf

    from engine.model.gguf_export import default_qtype, write_gguf
    from tests.model.tiny_models import float_tensors, wordpiece_gguf_metadata
    folder, hf, tok = bert
    config, tensors = float_tensors(folder)
    path = str(tmp_path / "bert.gguf")
    q = gguf.GGMLQuantizationType[qtype]
    write_gguf(path, dataclasses.replace(config, pooling_type="MEAN"), tensors, default_qtype(q),
               tokenizer_metadata=wordpiece_gguf_metadata(tok))
    llm = LLM(model=path, **KW)
    mine = llm.get_tokenizer()
    for text in TEXTS + ["Unknown-Words, UPPER case: cafés!"]:
        assert mine.encode(text) == tok(text)["input_ids"], text
    enc = tok(TEXTS[0], TEXTS[1])
    assert mine.encode_pair(TEXTS[0], TEXTS[1]) == (enc["input_ids"], enc["token_type_ids"])
    tol = 2e-3 if qtype == "F32" else 3e-2
    for text, out in zip(TEXTS, llm.embed(TEXTS, use_tqdm=False)):
        want = torch.nn.functional.normalize(_hidden(hf, tok, text).mean(dim=0), dim=0).numpy()
        assert np.abs(np.asarray(out.outputs.embedding) - want).max() < tol


UNIGRAM_TEXTS = ["hello world caf\u00e9", "  the quick\tbrown \ufb01 fox  ", "\uff26\uff55\uff4c\uff4c width \u2460 \u6771\u4eac!",
                 "na\u00efve r\u00e9sum\u00e9 \u00fcber stra\u00dfe", "Unseen CAPITALS", ""]


def test_a_gguf_in_llama_cpps_xlm_roberta_layout_tokenizes_and_embeds(tmp_path):
    """An XLM-RoBERTa GGUF with the tokenizer keys llama.cpp's converter writes from sentencepiece.bpe.model (model
    "t5": Unigram pieces and scores, the NFKC charsmap, fairseq's realigned ids; bge-m3 and multilingual-E5 ship so):
    the ids of transformers' tokenizer for texts (full-width forms, ligatures, whitespace runs, pieces unknown to it, an empty one) and
    pairs (<s> a </s></s> b </s>), decoding back, and transformers' CLS vectors."""
    from engine.model.gguf_export import write_gguf
    from tests.model.tiny_models import float_tensors, save_sentencepiece, unigram_gguf_metadata
    hf = tiny_encoder("xlm-roberta")
    hf.save_pretrained(tmp_path, safe_serialization=True)
    tok = save_sentencepiece(tmp_path)
    config, tensors = float_tensors(tmp_path)
    path = str(tmp_path / "xlmr.gguf")
    write_gguf(path, config, tensors, tokenizer_metadata=unigram_gguf_metadata(tmp_path, config.vocab_size))
    llm = LLM(model=path, **KW)
    mine = llm.get_tokenizer()
    for text in UNIGRAM_TEXTS:
        assert mine.encode(text) == tok(text)["input_ids"], text
    assert len(tok(UNIGRAM_TEXTS[2])["input_ids"]) > 8  # NFKC made words of the full-width letters
    assert mine.encode_pair(TEXTS[0], UNIGRAM_TEXTS[3])[0] == tok(TEXTS[0], UNIGRAM_TEXTS[3])["input_ids"]
    assert mine.decode(mine.encode(UNIGRAM_TEXTS[3]), skip_special_tokens=True) == UNIGRAM_TEXTS[3]
    for text, out in zip(UNIGRAM_TEXTS[:4], llm.embed(UNIGRAM_TEXTS[:4], use_tqdm=False)):
        want = torch.nn.functional.normalize(_hidden(hf, tok, text)[0], dim=0).numpy()
        assert np.abs(np.asarray(out.outputs.embedding) - want).max() < 2e-3


@pytest.mark.parametrize("prefill", ["bfloat16", "int8"])
def test_long_prompts_in_the_fast_prefill_precisions(bert, prefill):
    """Prompts longer than the GEMV rows run the dense path: bf16 GEMMs (the default where native) or W8A8 int8 ones;
    their vectors stay near transformers' float32 ones (cosine)."""
    folder, hf, tok = bert
    llm = LLM(model=str(folder), **{**KW, "dtype": "auto", "prefill_dtype": prefill})
    prompts = [[2] + [(7 * i + 11 * j) % 250 + 5 for i in range(40 + j)] + [3] for j in range(3)]
    for ids, out in zip(prompts, llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)):
        with torch.no_grad():
            h = hf(torch.tensor([ids])).last_hidden_state[0, 0].double()
        want = torch.nn.functional.normalize(h, dim=0).numpy()
        assert float(np.dot(out.outputs.embedding, want)) > (0.9999 if prefill == "bfloat16" else 0.999)


def _class_probs(hf, enc) -> np.ndarray:
    with torch.no_grad():
        return torch.softmax(hf(**enc).logits[0].double(), dim=-1).numpy()


def test_classify_through_the_pooler_and_classifier(tmp_path):
    labels = {0: "neg", 1: "neutral", 2: "pos"}
    hf, tok = saved(tmp_path, transformers.BertForSequenceClassification, num_labels=3, id2label=labels,
                    label2id={v: k for k, v in labels.items()})
    llm = LLM(model=str(tmp_path), **KW)
    for text, out in zip(TEXTS, llm.classify(TEXTS, use_tqdm=False)):
        want = _class_probs(hf, tok(text, return_tensors="pt"))
        assert np.abs(np.asarray(out.outputs.probs) - want).max() < 2e-3
        assert want.max() - want.min() > 0.05  # the head separates the classes: a wrong head would show


def test_roberta_classification_head(tmp_path):
    hf = tiny_encoder("roberta", transformers.RobertaForSequenceClassification, num_labels=2)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    save_wordpiece(tmp_path)
    llm = LLM(model=str(tmp_path), **KW)
    ids = [0, 7, 9, 12, 2]
    got = llm.classify({"prompt_token_ids": ids}, use_tqdm=False)[0].outputs.probs
    assert np.abs(np.asarray(got) - _class_probs(hf, {"input_ids": torch.tensor([ids])})).max() < 2e-3


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert-cross")
    hf, tok = saved(folder, transformers.BertForSequenceClassification, num_labels=1)
    with torch.no_grad():
        hf.classifier.weight.mul_(8.0)  # scores spread over (0, 1)
    hf.save_pretrained(folder, safe_serialization=True)
    return folder, hf, tok


def _pair_score(hf, tok, a, b) -> float:
    enc = tok(a, b, return_tensors="pt")  # [CLS] a [SEP] b [SEP], b's tokens type 1
    with torch.no_grad():
        return float(torch.sigmoid(hf(**enc).logits[0, 0].double()))


def test_cross_encoder_scores_pairs_with_their_token_types(cross_encoder):
    folder, hf, tok = cross_encoder
    llm = LLM(model=str(folder), **KW)
    query, docs = "the cat", ["the cat sat on the mat", "a big red house"]
    got = [o.outputs.score for o in llm.score(query, docs, use_tqdm=False)]
    want = [_pair_score(hf, tok, query, d) for d in docs]
    np.testing.assert_allclose(got, want, atol=2e-3)
    ids, types = tok(query, docs[0])["input_ids"], tok(query, docs[0])["token_type_ids"]
    n_query = len(tok(query)["input_ids"])  # [CLS] query [SEP] typed 0, then the document and its [SEP] typed 1
    assert types == [0] * n_query + [1] * (len(ids) - n_query) and len(ids) > n_query
    untyped = llm.classify({"prompt_token_ids": ids}, use_tqdm=False)[0].outputs.probs[0]
    assert abs(untyped - want[0]) > 1e-3  # the types matter: all-zero types score differently
    with pytest.raises(ValueError, match="token_type_ids has"):
        llm.classify({"prompt_token_ids": ids, "token_type_ids": types[:-1]}, use_tqdm=False)
    with pytest.raises(ValueError, match=r"lie in \[0, 2\)"):
        llm.classify({"prompt_token_ids": ids, "token_type_ids": [2] * len(ids)}, use_tqdm=False)
    typed = llm.classify({"prompt_token_ids": ids, "token_type_ids": types}, use_tqdm=False)[0].outputs.probs[0]
    assert abs(typed - want[0]) < 2e-3


def test_a_decoder_refuses_token_types(tmp_path):
    from tests.model.tiny_models import saved_tiny
    saved_tiny(tmp_path, "qwen3")
    llm = LLM(model=str(tmp_path), runner="pooling", **KW)
    with pytest.raises(ValueError, match="token types"):
        llm.embed({"prompt_token_ids": [3, 4], "token_type_ids": [0, 0]}, use_tqdm=False)


def test_server_embeddings_score_and_rerank(bert, cross_encoder):
    folder, hf, tok = bert
    with running_server("--model", str(folder), "--max-model-len", "64", "--dtype", "float32",
                        "--kv-cache-dtype", "fp32") as srv:
        with openai.OpenAI(base_url=srv.base_url + "/v1", api_key=srv.api_key, max_retries=0, timeout=60) as c:
            got = c.embeddings.create(model=srv.model, input=TEXTS[:2], encoding_format="float")
        for text, d in zip(TEXTS, got.data):
            want = torch.nn.functional.normalize(_hidden(hf, tok, text)[0], dim=0).numpy()
            assert np.abs(np.asarray(d.embedding) - want).max() < 2e-3
        assert got.usage.prompt_tokens == sum(len(tok(t)["input_ids"]) for t in TEXTS[:2])
    folder, hf, tok = cross_encoder
    with running_server("--model", str(folder), "--max-model-len", "64", "--dtype", "float32",
                        "--kv-cache-dtype", "fp32") as srv:
        headers = {"Authorization": f"Bearer {srv.api_key}"}
        r = httpx.post(srv.base_url + "/score", json={"text_1": "the cat", "text_2": ["a big red house", "the mat"]},
                       headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        want = [_pair_score(hf, tok, "the cat", d) for d in ("a big red house", "the mat")]
        np.testing.assert_allclose([d["score"] for d in r.json()["data"]], want, atol=2e-3)
        r = httpx.post(srv.base_url + "/v1/rerank", json={"query": "the cat", "documents": ["a big red house",
                                                                                            "the mat"]},
                       headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        scores = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        np.testing.assert_allclose([scores[0], scores[1]], want, atol=2e-3)
        r = httpx.post(srv.base_url + "/score", json={"text_1": "the cat", "text_2": "the mat",
                                                      "truncate_prompt_tokens": 3}, headers=headers, timeout=60)
        assert r.status_code == 400 and "truncate_prompt_tokens" in r.text
        r = httpx.post(srv.base_url + "/v1/rerank", json={"query": "the cat", "documents": []}, headers=headers,
                       timeout=60)
        assert r.status_code == 400 and "documents" in r.text
