"""BERT-family encoders (GGUF bert: BERT, RoBERTa, XLM-RoBERTa) against transformers: every row's last hidden state,
prompts of several lengths in one step (each attends over its own prompt only), from the HF folder and from GGUF files
written in llama.cpp's layout (F32 and Q8_0). An encoder has no decode step, so its blocks never run fused, and its
LayerNorm blocks have no torch twins yet: a GPU placement is refused by name."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import transformers

from engine.model.gguf_export import default_qtype, write_gguf
from engine.model.loader import load_model
from engine.worker.runner import ModelRunner, SeqChunk
from tests.model.tiny_models import ENCODERS, float_tensors, randomize, save_tiny_tokenizer, tiny_config
from tests.offload.helpers import placed

Q = gguf.GGMLQuantizationType
BLOCK = 4
# no token 1 (RoBERTa's padding_idx: transformers gives padding tokens the padding position)
PROMPTS = [[0, 5, 17, 99, 3, 250, 42, 7, 8, 9, 200, 13, 77, 31, 2], [0, 4, 4, 2], [0]]


def tiny_encoder(arch: str, cls=transformers.AutoModel, **overrides):
    torch.manual_seed(0)
    cfg = tiny_config(arch)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg._attn_implementation = "eager"
    model = cls.from_config(cfg, dtype=torch.float32) if cls is transformers.AutoModel else cls(cfg).float()
    return randomize(model, arch)


@pytest.fixture(scope="module", params=ENCODERS)
def encoder(request, tmp_path_factory):
    """(arch, HF folder, {name: GGUF path}, transformers' hidden states per prompt)."""
    arch = request.param
    hf = tiny_encoder(arch)
    folder = tmp_path_factory.mktemp(arch)
    hf.save_pretrained(folder, safe_serialization=True)
    config, tensors = float_tensors(folder)
    files = {"f32": str(folder / "f32.gguf"), "q8_0": str(folder / "q8_0.gguf")}
    write_gguf(files["f32"], config, tensors)
    write_gguf(files["q8_0"], config, tensors, default_qtype(Q.Q8_0))
    with torch.no_grad():
        refs = [hf(torch.tensor([p])).last_hidden_state[0].numpy() for p in PROMPTS]
    return arch, str(folder), files, refs


def hidden_states(path: str) -> list[np.ndarray]:
    """Every prompt's rows, all prompts in one step, each in its own blocks."""
    model, _ = load_model(path)
    runner = ModelRunner(model, num_blocks=16, block_size=BLOCK, kv_cache_dtype="fp32")
    chunks, first = [], 1
    for p in PROMPTS:
        n = -(-len(p) // BLOCK)
        chunks.append(SeqChunk(tuple(p), 0, tuple(range(first, first + n)), "all"))
        first += n
    return runner.execute_hidden(chunks)


@pytest.mark.parametrize("which,tol", [("hf", 2e-3), ("f32", 2e-3), ("q8_0", 3e-2)])
def test_hidden_states_match_transformers(encoder, which, tol):
    arch, folder, files, refs = encoder
    got = hidden_states(folder if which == "hf" else files[which])
    for g, r in zip(got, refs):
        assert g.shape == r.shape
        assert np.abs(g - r).max() / np.abs(r).max() < tol, arch


def test_gguf_holds_llama_cpps_bert_layout(encoder):
    arch, _, files, _ = encoder
    r = gguf.GGUFReader(files["f32"])
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "position_embd.weight", "token_embd_norm.weight", "token_embd_norm.bias",
            "blk.0.attn_q.bias", "blk.0.attn_output_norm.bias", "blk.1.layer_output_norm.weight",
            "blk.1.ffn_up.bias", "token_types.weight"} <= names
    pos = next(t for t in r.tensors if t.name == "position_embd.weight")
    assert int(pos.shape[-1]) == 64  # RoBERTa's two offset rows are cut, as llama.cpp's converter cuts them
    fields = {f.name: f for f in r.fields.values()}
    assert bool(fields["bert.attention.causal"].parts[-1][0]) is False
    assert "bert.attention.layer_norm_epsilon" in fields


def test_an_encoder_never_runs_fused_and_refuses_a_gpu(encoder):
    _, folder, _, _ = encoder
    model, _ = load_model(folder)
    assert all(b.fused._build() is False for b in model.blocks)
    with pytest.raises(NotImplementedError, match="CPU only"):
        placed(folder, n_gpu_layers="all")


def test_info_describes_an_encoder(encoder):
    from engine.model.info import format_info, model_info
    arch, folder, files, _ = encoder
    for path in (folder, files["q8_0"]):
        text = format_info(model_info(path))
        assert "rope:           none (learned absolute positions" in text, text
        assert "layer-norm eps 1e-12, encoder (attends both ways), pooling CLS" in text, text


def test_positions_beyond_the_learned_ones_are_refused(tmp_path):
    hf = tiny_encoder("bert")
    hf.save_pretrained(tmp_path, safe_serialization=True)
    save_tiny_tokenizer(tmp_path)
    from engine import LLM
    with pytest.raises(ValueError, match="exceeds the model's context"):
        LLM(model=str(tmp_path), max_model_len=65, kv_cache_memory=0.05)
