"""EmbeddingGemma's shape against transformers: a gemma3 text model with bidirectional attention (a sliding layer
sees |i - j| < window on both sides), saved bare (Gemma3TextModel's names) with sentence-transformers modules (mean
pooling, two Dense projections, Normalize); LLM.embed equals the sentence-transformers pipeline run on transformers'
hidden states. Such a model only pools, and a prompt runs in one step. The same weights as llama.cpp's converter
writes EmbeddingGemma (arch gemma-embedding, dense_2 / dense_3 tensors, mean pooling_type) give the same vectors."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file

from engine import LLM
from tests.model.tiny_models import randomize, save_tiny_tokenizer, tiny_config

KW = dict(max_model_len=64, kv_cache_memory=0.05, dtype="float32", kv_cache_dtype="fp32", runner="pooling")
PROMPTS = [[5, 9, 200, 3, 17, 42, 7, 8, 100, 11, 12], [4, 4, 4], [250]]


def _dense(folder, w: torch.Tensor, act: str):
    folder.mkdir()
    save_file({"linear.weight": w.contiguous()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"in_features": w.shape[1], "out_features": w.shape[0],
                                                    "bias": False, "activation_function": act}))


@pytest.fixture(scope="module")
def embedding_gemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("embeddinggemma")
    return (root, *saved_embedding_gemma(root))


def saved_embedding_gemma(root):
    """A tiny EmbeddingGemma-shaped folder at root (the model, two Dense modules, mean pooling, Normalize); returns
    (transformers' model, the two projections in float64)."""
    cfg = tiny_config("gemma3")
    cfg.use_bidirectional_attention, cfg._attn_implementation = True, "eager"
    torch.manual_seed(0)
    model = randomize(transformers.Gemma3TextModel(cfg).float(), "gemma3")
    model.save_pretrained(root, safe_serialization=True)
    save_tiny_tokenizer(root)
    g = torch.Generator().manual_seed(1)
    up, down = torch.randn(512, 256, generator=g) * 0.05, torch.randn(256, 512, generator=g) * 0.05
    _dense(root / "2_Dense", up, "torch.nn.modules.linear.Identity")
    _dense(root / "3_Dense", down, "torch.nn.modules.linear.Identity")
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    return model, up.double(), down.double()


def _reference(model, up, down, ids):
    with torch.no_grad():
        h = model(torch.tensor([ids])).last_hidden_state[0].double().mean(dim=0)
    return torch.nn.functional.normalize(down @ (up @ h), dim=0).numpy()


def test_embeddings_match_the_sentence_transformers_pipeline(embedding_gemma):
    root, model, up, down = embedding_gemma
    llm = LLM(model=str(root), **KW)
    got = llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    for ids, out in zip(PROMPTS, got):
        want = _reference(model, up, down, ids)
        assert len(out.outputs.embedding) == 256
        assert np.abs(np.asarray(out.outputs.embedding) - want).max() < 2e-3
    causal = np.asarray(llm.embed({"prompt_token_ids": PROMPTS[0][:6]}, use_tqdm=False)[0].outputs.embedding)
    assert np.abs(causal - _reference(model, up, down, PROMPTS[0][:6])).max() < 2e-3  # a short prompt too


def gemma_embedding_gguf(root, up, down, path: str, qtype=None) -> str:
    """The folder's model as llama.cpp's converter writes EmbeddingGemma with its Dense modules: arch gemma-embedding,
    the projections as dense_2 / dense_3, mean pooling; a byte-level vocabulary of its size."""
    import dataclasses

    import gguf

    from bench.llamacpp_load import byte_vocab
    from engine.model.gguf_export import default_qtype, write_gguf
    from tests.model.tiny_models import float_tensors
    config, tensors = float_tensors(root)
    config = dataclasses.replace(config, arch="gemma-embedding", pooling_type="MEAN")
    tensors.update({"dense_2.weight": up.float().numpy(), "dense_3.weight": down.float().numpy()})
    keys = byte_vocab(config.vocab_size)
    keys["tokenizer.ggml.tokens"][-1] = "\u0120\u0120"  # the one merge's result ("Ġ Ġ"), a token as the rules ask
    for name, w in (("dense_2", up), ("dense_3", down)):  # the converter's size keys beside the vocabulary's
        keys[f"gemma-embedding.{name}_feat_in"], keys[f"gemma-embedding.{name}_feat_out"] = w.shape[1], w.shape[0]
    write_gguf(path, config, tensors, default_qtype(qtype or gguf.GGMLQuantizationType.F32), tokenizer_metadata=keys)
    return path


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_llama_cpps_gemma_embedding_gguf(embedding_gemma, tmp_path, qtype):
    import gguf
    root, model, up, down = embedding_gemma
    path = gemma_embedding_gguf(root, up, down, str(tmp_path / "eg.gguf"), gguf.GGMLQuantizationType[qtype])
    fields = {f.name: f for f in gguf.GGUFReader(path).fields.values()}
    saved = json.loads((root / "config.json").read_text())["sliding_window"]  # transformers' (W - 1) * 2
    assert int(fields["gemma-embedding.attention.sliding_window"].parts[-1][0]) == saved == 8
    llm = LLM(model=path, **{**KW, "runner": "auto"})  # an encoder: auto pools
    tol = 2e-3 if qtype == "F32" else 3e-2
    for ids, out in zip(PROMPTS, llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)):
        assert len(out.outputs.embedding) == 256
        assert np.abs(np.asarray(out.outputs.embedding) - _reference(model, up, down, ids)).max() < tol


def test_an_encoder_only_pools_and_unknown_modules_are_refused(embedding_gemma, tmp_path):
    root, *_ = embedding_gemma
    with pytest.raises(ValueError, match="bidirectionally"):
        LLM(model=str(root), **{**KW, "runner": "generate"})
    modules = json.loads((root / "modules.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in root.iterdir():
        if f.is_file():
            (bad / f.name).write_bytes(f.read_bytes())
    (bad / "modules.json").write_text(json.dumps([{"idx": 5, "name": "5", "path": "",
                                                   "type": "sentence_transformers.models.LayerNorm"}] + modules))
    with pytest.raises(ValueError, match="LayerNorm"):
        LLM(model=str(bad), **KW)
