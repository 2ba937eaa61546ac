"""Incremental detokenizer and stop strings (engine/tokenization/detokenizer.py) on real `tokenizers` tokenizers."""
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from engine.tokenization.detokenizer import IncrementalDetokenizer, fill_decoded_tokens
from engine.outputs import Logprob
from engine.sample.sampling import SamplingParams

TEXTS = ["hello world", "héllo 😀 世界!", "naïve café 🎉🎉 日本語のテキスト", "a👩‍👩‍👧b", "𝔘𝔫𝔦 ∑ ok"]


class Wrapped:
    """The interface the detokenizer relies on, over a tokenizers.Tokenizer."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text):
        return self.tok.encode(text).ids

    def decode(self, ids, skip_special_tokens=True):
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids):
        return [self.tok.id_to_token(i) for i in ids]


@pytest.fixture(scope="module")
def byte_level():
    """GPT-2 style byte-level BPE, trained on ASCII only: non-ASCII characters become byte tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the end of it. stop here ok"] * 20, trainer)
    return Wrapped(tok)


@pytest.fixture(scope="module")
def sentencepiece():
    """Llama/Gemma style: '▁' for spaces, byte fallback <0xNN>, leading space stripped on decode."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in "▁abcdefghijklmnopqrstuvwxyz,.!?":
        vocab[c] = len(vocab)
    merges = [("▁", "h"), ("▁h", "e"), ("l", "l"), ("▁he", "ll"), ("▁hell", "o"), ("▁", "w"),
              ("o", "r"), ("▁w", "or"), ("l", "d"), ("▁wor", "ld")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return Wrapped(tok)


def _stream(tokenizer, params, ids, prompt=(), finished_at_end=False, delta=True):
    """Feed ids one at a time; return (detokenizer, list of streamed pieces, stop string)."""
    detok = IncrementalDetokenizer(tokenizer, params, prompt)
    pieces, stop = [], None
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        stop = detok.update([t], finished=finished_at_end and last)
        finished = stop is not None or (finished_at_end and last)
        pieces.append(detok.get_next_output_text(finished=finished, delta=delta))
        if stop is not None:
            break
    return detok, pieces, stop


@pytest.mark.parametrize("tok_name", ["byte_level", "sentencepiece"])
@pytest.mark.parametrize("text", TEXTS)
def test_incremental_equals_full_decode(request, tok_name, text):
    tok = request.getfixturevalue(tok_name)
    ids = tok.encode(text)
    if not text.isascii():                       # multi-byte characters really are split
        assert any("\ufffd" in tok.decode(ids[:i]) for i in range(len(ids)))
    detok, pieces, _ = _stream(tok, SamplingParams(), ids)
    assert detok.output_text == tok.decode(ids) == text
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert detok.token_ids == ids


@pytest.mark.parametrize("tok_name", ["byte_level", "sentencepiece"])
def test_prompt_context_gives_first_token_its_space(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    text = "hello world 😀 end"
    ids = tok.encode(text)
    for split in range(1, len(ids)):
        prompt, out = ids[:split], ids[split:]
        detok, _, _ = _stream(tok, SamplingParams(), out, prompt)
        full, head = tok.decode(ids), tok.decode(prompt)
        if not head.endswith("\ufffd"):          # a prompt cut inside a character has no clean text
            assert detok.output_text == full[len(head):], split


def test_sentencepiece_leading_space(sentencepiece):
    hello, world = sentencepiece.encode("hello"), sentencepiece.encode("world")
    assert sentencepiece.decode(world) == "world"          # alone, the '▁' space is stripped
    detok, _, _ = _stream(sentencepiece, SamplingParams(), world, prompt=hello)
    assert detok.output_text == " world"


def test_special_tokens_skipped_or_kept(sentencepiece):
    ids = sentencepiece.encode("hello") + [2]
    assert _stream(sentencepiece, SamplingParams(), ids)[0].output_text == "hello"
    kept = _stream(sentencepiece, SamplingParams(skip_special_tokens=False), ids)[0].output_text
    assert kept == sentencepiece.decode(ids, skip_special_tokens=False)


def test_unfinished_character_flushed_at_finish(byte_level):
    ids = byte_level.encode("ok 😀")[:-2]                   # stop inside the emoji
    detok, pieces, _ = _stream(byte_level, SamplingParams(), ids)
    assert detok.output_text == "ok "                       # held back while running
    detok, pieces, _ = _stream(byte_level, SamplingParams(), ids, finished_at_end=True)
    assert detok.output_text == byte_level.decode(ids) and detok.output_text.endswith("\ufffd")
    assert "".join(pieces) == detok.output_text


# ---- stop strings ----------------------------------------------------------------------------

@pytest.mark.parametrize("tok_name", ["byte_level", "sentencepiece"])
@pytest.mark.parametrize("stop, include, expected", [
    ("world", False, "hello "),
    ("world", True, "hello world"),
    ("lo wo", False, "hel"),                              # spans a token boundary
    ("lo wo", True, "hello wo"),                          # cut inside a token
    ("世", False, "hello world 😀 "),                     # needs three byte tokens
    ("😀 世", True, "hello world 😀 世"),
    ("absent", False, "hello world 😀 世界!"),
])
def test_stop_strings_cut_exactly(request, tok_name, stop, include, expected):
    tok = request.getfixturevalue(tok_name)
    ids = tok.encode("hello world 😀 世界!")
    params = SamplingParams(stop=[stop], include_stop_str_in_output=include)
    detok, pieces, matched = _stream(tok, params, ids)
    assert detok.output_text == expected
    assert matched == (None if stop == "absent" else stop)
    if matched is None:
        pieces.append(detok.get_next_output_text(finished=True, delta=True))
    assert "".join(pieces) == expected                    # the stream never showed a cut part
    if matched is not None:                              # a stopped completion takes no more text
        assert detok.update(tok.encode(" more")) is None and detok.output_text == expected


def test_earliest_stop_string_wins(byte_level):
    ids = byte_level.encode("hello world, the end")
    detok, _, matched = _stream(byte_level, SamplingParams(stop=["the", "lo w"]), ids)
    assert matched == "lo w" and detok.output_text == "hel"
    # Several in one update: the earliest position wins whatever the list order.
    detok = IncrementalDetokenizer(byte_level, SamplingParams(stop=["end", "world"]))
    assert detok.update(ids) == "world" and detok.output_text == "hello "


def test_stream_holds_back_possible_stop_prefix(byte_level):
    params = SamplingParams(stop=["world!"])
    detok = IncrementalDetokenizer(byte_level, params)
    sent = ""
    for t in byte_level.encode("hello wor"):
        detok.update([t])
        sent += detok.get_next_output_text(finished=False, delta=True)
    assert sent == "hello " and detok.output_text == "hello wor"
    for t in byte_level.encode("ld ok"):                  # not the stop string after all
        detok.update([t])
        sent += detok.get_next_output_text(finished=False, delta=True)
    assert sent == "hello world ok"
    assert detok.get_next_output_text(finished=False, delta=False) == "hello world ok"


def test_stop_token_excluded_unless_included(byte_level):
    ids = byte_level.encode("hello.")
    for include, expected in ((False, "hello"), (True, "hello.")):
        detok = IncrementalDetokenizer(byte_level, SamplingParams(include_stop_str_in_output=include))
        detok.update(ids[:-1])
        assert detok.update(ids[-1:], stop_terminated=True, finished=True) is None
        assert detok.output_text == expected and detok.token_ids == ids


def test_min_tokens_defers_stop_strings(byte_level):
    ids = byte_level.encode("hello world hello")
    n_hello = len(byte_level.encode("hello"))
    detok, _, matched = _stream(byte_level, SamplingParams(stop=["hello"], min_tokens=n_hello), ids)
    assert matched == "hello" and detok.output_text == "hello world "


def test_detokenize_false_tracks_ids_only(byte_level):
    ids = byte_level.encode("hello")
    detok, pieces, _ = _stream(byte_level, SamplingParams(detokenize=False), ids)
    assert detok.output_text == "" and detok.token_ids == ids and pieces == [""] * len(ids)


def test_fill_decoded_tokens(byte_level):
    world = byte_level.encode(" world")[0]
    entries = [{world: Logprob(-0.1, 1)}, None, {0: Logprob(-2.0, 3, "x")}]
    fill_decoded_tokens(byte_level, entries)
    assert entries[0][world].decoded_token == byte_level.decode([world])
    assert entries[2][0].decoded_token == "x"
