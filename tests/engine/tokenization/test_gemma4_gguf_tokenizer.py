"""The GGUF tokenizer type "gemma4" (Gemma 4's BPE over raw UTF-8 with spaces as "▁") gives llama.cpp's ids: a tiny
vocabulary with merges, byte tokens, control and user-defined tokens, and a run of newlines that is a token no
merge reaches (llama.cpp takes such a run whole), tokenized by both."""
from __future__ import annotations

import gguf
import pytest

from engine.model.config import ModelConfig
from engine.model.gguf import open_gguf
from engine.model.gguf_export import _add_kv, write_metadata
from engine.tokenization.tokenizer import Tokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
MERGES = ["h e", "l l", "he ll", "hell o", "▁ w", "o r", "▁w or", "▁wor l", "▁worl d", "\n \n", "u s", "us e", "use r"]
TEXTS = ["hello world", "hello\n\n\nworld", "hello  world", " hello", "héllo wörld", "<|turn>user\nhello<turn|>\n",
         "\n\nhello\n", "<|channel>hello", "xyz\n\n"]


def write_vocab_gguf(path) -> None:
    """A gemma4 GGUF holding hyperparameters and a tokenizer, no tensors (llama.cpp loads it vocab-only)."""
    toks = [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN), ("<|turn>", CONTROL),
            ("<turn|>", CONTROL), ("<|channel>", USER_DEFINED)]
    toks += [(f"<0x{b:02X}>", BYTE) for b in range(256)]
    toks += [(c, NORMAL) for c in "▁abcdefghijklmnopqrstuvwxyz\n"]
    toks += [(m.replace(" ", ""), NORMAL) for m in MERGES]
    toks.append(("\n\n\n", NORMAL))  # merges give "\n\n" + "\n": llama.cpp takes the run whole
    cfg = ModelConfig(arch="gemma4", vocab_size=len(toks), hidden_size=64, intermediate_size=128, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=32, head_dim_global=64, layer_sliding_window=(4, 0))
    w = gguf.GGUFWriter(str(path), "gemma4")
    write_metadata(w, cfg)
    md = {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": [t for t, _ in toks],
          "tokenizer.ggml.token_type": [ty for _, ty in toks], "tokenizer.ggml.scores": [0.0] * len(toks),
          "tokenizer.ggml.merges": MERGES, "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
          "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0,
          "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": False}
    for key, value in md.items():
        _add_kv(w, key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4_vocab") / "vocab.gguf"
    write_vocab_gguf(path)
    return path


def test_ids_equal_llama_cpp(vocab_file):
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(str(vocab_file), vocab_only=True, verbose=False)
    tok = Tokenizer.from_gguf_metadata(open_gguf(str(vocab_file)).metadata)
    for text in TEXTS:
        assert tok.encode(text) == ref.tokenize(text.encode(), add_bos=True, special=True), repr(text)


def test_newline_run_token_and_byte_fallback_and_round_trip(vocab_file):
    tok = Tokenizer.from_gguf_metadata(open_gguf(str(vocab_file)).metadata)
    ids = tok.encode("hello\n\n\nwörld")
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces[:3] == ["<bos>", "hello", "\n\n\n"]  # the run whole, not "\n\n" + "\n"
    assert "<0xC3>" in pieces and "<0xB6>" in pieces  # ö has no token: its UTF-8 bytes
    for text in TEXTS:
        assert tok.decode(tok.encode(text), skip_special_tokens=False) == "<bos>" + text
