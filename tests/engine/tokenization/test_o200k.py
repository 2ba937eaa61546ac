"""gpt-oss's tokenizer (o200k_harmony) as its GGUF carries it (byte-level BPE, pre "gpt-4o"), built from the real
o200k_base vocabulary that the bpe-openai package ships, against that package's own (Rust) encoder; the harmony
special tokens and stop tokens on top."""
from __future__ import annotations

import base64
import gzip
import importlib.resources

import numpy as np
import pytest

from engine.tokenization.tokenizer import Tokenizer
from engine.tokenization.tokenizer_gguf import CONTROL, NORMAL, PRE_TOKENIZER_SPLITS, bytes_to_unicode
from tests.engine.tokenization.test_tokenizer import BATTERY

bpe_openai = pytest.importorskip("bpe_openai", reason="pip install bpe-openai (the o200k_base vocabulary)")

# o200k_harmony's special tokens from 199998 on (the rest up to 201087 are <|reserved_N|>)
HARMONY = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
           200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>",
           200018: "<|endofprompt|>"}
VOCAB = 201088


def _bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's BPE of `token` using only merges ranked below max_rank (its last merge is then the pair)."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[1]):
                best = (i, r)
        if best is None:
            return parts
        i = best[0]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


@pytest.fixture(scope="module")
def o200k():
    """(ramlm's tokenizer from gpt-oss-style GGUF metadata, the package's o200k_base encoding)."""
    raw = (importlib.resources.files("bpe_openai.data") / "o200k_base.tiktoken.gz").read_bytes()
    ranks = {}
    for line in gzip.decompress(raw).splitlines():
        tok, rank = line.split()
        ranks[base64.b64decode(tok)] = int(rank)
    assert sorted(ranks.values()) == list(range(len(ranks))) and len(ranks) == 199998
    spell = bytes_to_unicode()
    by_rank = sorted(ranks, key=ranks.get)
    tokens = ["".join(spell[b] for b in t) for t in by_rank]
    merges = []  # llama.cpp's converter takes tokenizer.json's, which are these (rank order)
    for t in by_rank:
        if len(t) > 1:
            a, b = _bpe_parts(ranks, t, ranks[t])
            merges.append("".join(spell[x] for x in a) + " " + "".join(spell[x] for x in b))
    types = [NORMAL] * len(tokens)
    for i in range(len(tokens), VOCAB):
        tokens.append(HARMONY.get(i, f"<|reserved_{i}|>"))
        types.append(CONTROL)
    md = {"general.architecture": "gpt-oss", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o",
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.array(types, np.int32),
          "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 199998,
          "tokenizer.ggml.eos_token_id": 200002, "tokenizer.ggml.padding_token_id": 199999}
    return Tokenizer.from_gguf_metadata(md), bpe_openai.get_encoding("o200k_base"), md


def test_the_gpt4o_split_is_o200k_s():
    assert PRE_TOKENIZER_SPLITS["gpt-4o"] == bpe_openai.get_encoding("o200k_base")._pat_str


def test_o200k_ids_match_the_reference_encoder(o200k):
    tok, ref, _ = o200k
    texts = BATTERY + ["The quick brown fox's CamelCaseWord HTTPServer2 don't", "x=1/2/3\n//comment\r\n",
                       "1234567 12,345.678", "über ÅNGSTRÖM naïve Œuvre", "tabs\t\t and   spaces  \n  \n"]
    for text in texts:
        want = ref.encode_ordinary(text)
        assert tok.encode(text, add_special_tokens=False) == want, text
        assert tok.decode(want) == text, text


def test_harmony_specials_and_stop_tokens(o200k):
    """A harmony turn tokenizes its markers as single special tokens; generation stops at <|return|> and <|call|>,
    not at <|end|> (which closes the analysis channel's message before the final one)."""
    tok, ref, md = o200k
    text = "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>"
    want = ([200006] + ref.encode_ordinary("user") + [200008] + ref.encode_ordinary("What is 2+2?") +
            [200007, 200006] + ref.encode_ordinary("assistant") + [200005] + ref.encode_ordinary("final") +
            [200008] + ref.encode_ordinary("4") + [200002])
    assert tok.encode(text, add_special_tokens=False) == want
    assert tok.encode("Hi") == tok.encode("Hi", add_special_tokens=False)  # no BOS in front (HF prompts have none)
    assert tok.eos_token_ids[0] == 200002
    assert {200002, 200012, 199999} <= set(tok.eos_token_ids) and 200007 not in tok.eos_token_ids
    assert tok.decode(want) == "user" + "What is 2+2?" + "assistant" + "final" + "4"
    from engine.model.gguf_config import _token_ids  # the model config's EOG set follows the same rule

    class File:
        metadata = md
    bos, eos = _token_ids(File)
    assert bos == 199998 and eos[0] == 200002 and {200012, 199999} <= set(eos) and 200007 not in eos
