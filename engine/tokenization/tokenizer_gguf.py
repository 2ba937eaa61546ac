"""A `tokenizers` tokenizer built from a GGUF file's tokenizer metadata (llama.cpp's key names).

A GGUF carries no tokenizer.json: it stores the vocabulary, scores, token types and (for byte-level BPE)
the merges. We rebuild the tokenizer the way transformers' GGUF converter does
(transformers/integrations/gguf/gguf_tokenizer_mapping.py), so that our ids equal both transformers' and
llama.cpp's on the reference prompts, without transformers' ~20 s:

- tokenizer.ggml.model == "llama" (SentencePiece-style): a BPE model with byte fallback whose merges are
  every split of every token into two vocabulary tokens, best first. Gemma files are special: their
  whitespace-run tokens are stored as real spaces (respelled to "▁"), their scores do not follow the
  merge order (the position in the file does), and spaces become "▁" in a normalizer, with no prefix space.
- tokenizer.ggml.model == "gpt2" (byte-level BPE): the file's merges, split by the regex of
  tokenizer.ggml.pre (Llama 3, Qwen 2, ...), then mapped to the byte alphabet.
- tokenizer.ggml.model == "gemma4" (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4, read in its llama-vocab.cpp): the file's
  merges over raw UTF-8 characters (no byte alphabet), spaces escaped to "▁" first, the text split only into runs
  of newlines and runs of the rest, a run of newlines that is a token taken whole, characters without a token as
  <0xXX> byte tokens. Newline-run tokens become added tokens here (matched whole, longest first): runs longer
  than the longest such token split greedily where llama.cpp would merge them by rank.
- tokenizer.ggml.model == "bert" (llama.cpp's WPM, BERT's WordPiece): the vocabulary is stored in "phantom space"
  spelling (llama.cpp's converter writes a word-initial piece as "▁piece" and a continuation "##piece" as "piece",
  [bracketed] specials as they are); it is spelled back for a WordPiece model behind BERT's normalizer (lower case,
  accents stripped, as llama.cpp's WPM always does) and pre-tokenizer; [CLS] (the BOS id) $A [SEP] and, for pairs,
  $B:1 [SEP]:1 (the separator id) as BERT's template.
- tokenizer.ggml.model == "t5" (llama.cpp's UGM: SentencePiece's Unigram, as its converter writes XLM-RoBERTa's
  sentencepiece.bpe.model for bge-m3 / multilingual-E5): a Unigram model over the file's pieces and scores, text
  normalized by the file's precompiled_charsmap (SentencePiece's NFKC rules), words split at whitespace
  (remove_extra_whitespaces) each with "▁" in front (add_space_prefix), as transformers' XLM-RoBERTa tokenizer; BOS
  $A EOS as the file's flags ask, pairs BOS $A EOS SEP $B EOS (llama-server's rerank input, transformers' pair).
- CONTROL tokens (type 3) become special added tokens (matched whole in text, skipped by
  decode(skip_special_tokens=True)); USER_DEFINED tokens (type 4) become plain added tokens (matched whole,
  kept on decode).

Building gemma-3-270m's 262k vocabulary takes a few seconds, so the result is cached as a tokenizer.json
(written atomically) and later loaded with `tokenizers.Tokenizer.from_str` in about a second.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE, Unigram, WordPiece

from cpu_kernels import envs
from engine.errors import ModelLoadError

# Bump when the built tokenizer.json changes, so that stale cache files are not read.
BUILD_VERSION = 2

# llama.cpp's token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GEMMA_ARCHS = ("gemma", "gemma2", "gemma3", "gemma3n")

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> the split regex its merges were learned with (transformers' table).
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                     "lfm2", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), _GPT4O_SPLIT),
}
# llama.cpp sets ignore_merges (a word that is a whole token is taken as is) and add_bos for these.
_LLAMA3_PRES = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")


def tokenizer_cache_key(path: str | os.PathLike) -> str:
    """A cache key for the tokenizer of a model file: its absolute path, size and mtime, hashed."""
    st = os.stat(path)
    raw = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def cache_dir() -> Path:
    """$RAMLM_CACHE_DIR/tokenizers, default ~/.cache/ramlm/tokenizers."""
    base = envs.get("RAMLM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ramlm")
    return Path(base) / "tokenizers"


def add_bos_default(metadata: Mapping[str, Any]) -> bool:
    """Whether encode() adds BOS: the file's flag, else llama.cpp's default (SPM and Llama-3 BPE: yes)."""
    flag = metadata.get("tokenizer.ggml.add_bos_token")
    if flag is not None:
        return bool(flag)
    model = metadata.get("tokenizer.ggml.model")
    return model == "llama" or (model == "gpt2" and metadata.get("tokenizer.ggml.pre") in _LLAMA3_PRES)


def load_or_build(metadata: Mapping[str, Any], cache_key: str | None = None) -> Tokenizer:
    """The backend tokenizer for GGUF tokenizer metadata, from the cache when `cache_key` has one.

    Args:
        metadata: GGUF metadata (tokenizer.ggml.* keys; general.architecture picks Gemma's variant).
        cache_key: names the cache file (e.g. `tokenizer_cache_key(path)`); None builds without caching.
    Returns:
        tokenizers.Tokenizer with BOS/EOS added by its post-processor as the file asks.
    Raises:
        ModelLoadError: no or unsupported tokenizer metadata.
    """
    path = None
    if cache_key:
        safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in cache_key)[:120]
        if safe != cache_key:  # keys that differ only in the replaced characters must not collide
            safe += "-" + hashlib.sha256(cache_key.encode()).hexdigest()[:12]
        path = cache_dir() / f"{safe}.v{BUILD_VERSION}.json"
        if path.is_file():
            try:
                return Tokenizer.from_file(str(path))
            except Exception:  # a damaged cache file: rebuild it
                pass
    text = build_tokenizer_json(metadata)
    if path is not None:
        _write_atomic(path, text)
    return Tokenizer.from_str(text)


def _write_atomic(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)  # mkstemp makes it private; it holds nothing secret
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:  # a read-only home still gets a working tokenizer, just not a cached one
        pass


def build_tokenizer_json(metadata: Mapping[str, Any]) -> str:
    """tokenizer.json text for GGUF tokenizer metadata (see the module docstring for the rules)."""
    model = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelLoadError("GGUF metadata has no tokenizer.ggml.tokens: cannot build a tokenizer")
    tokens = list(tokens)
    types = metadata.get("tokenizer.ggml.token_type")
    types = [NORMAL] * len(tokens) if types is None else [int(t) for t in types]
    arch = metadata.get("general.architecture", "")
    if model == "llama":
        tok, vocab_tokens, merges, alphabet = _sentencepiece(metadata, tokens, arch)
    elif model == "gpt2":
        tok, vocab_tokens, merges, alphabet = _byte_level(metadata, tokens)
    elif model == "gemma4":
        tok, vocab_tokens, merges, alphabet = _gemma4(metadata, tokens)
    elif model == "bert":
        tok, vocab_tokens, merges, alphabet = _wordpiece(metadata, tokens)
    elif model == "t5":
        tok, vocab_tokens, merges, alphabet = _unigram(metadata, tokens)
    else:
        raise ModelLoadError(f"tokenizer.ggml.model {model!r} is not supported (supported: llama, gpt2, gemma4, "
                             "bert, t5)")

    vocab = {t: i for i, t in enumerate(vocab_tokens)}
    special_ids = {i for i, ty in enumerate(types) if ty == CONTROL}
    for key in ("bos", "eos", "unknown", "padding"):  # named tokens are special whatever their type
        i = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(i, int) and 0 <= i < len(tokens):
            special_ids.add(i)
    added = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if i in special_ids:
            # A byte-level "control" token spelled outside the byte alphabet is a llama.cpp mislabel.
            if alphabet is None or set(t) <= alphabet:
                added.append(_added(i, vocab_tokens[i], special=True))
        elif ty == USER_DEFINED and t in vocab:  # whitespace runs respelled for Gemma drop out here
            added.append(_added(i, t, special=False))
        elif model == "gemma4" and t and not t.strip("\n"):  # a newline run that is a token stays whole
            added.append(_added(i, t, special=False))

    if model not in ("bert", "t5"):  # _wordpiece and _unigram set their templates
        _set_post_processor(tok, metadata, tokens)
    doc = json.loads(tok.to_str())
    doc["added_tokens"] = added
    if model == "t5":  # Unigram's vocabulary is its (piece, score) list, set by _unigram
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    doc["model"]["vocab"] = vocab
    if model == "bert":
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    # "a b" strings load ~30 % faster than pairs; only usable when no piece holds a space.
    if all(" " not in a and " " not in b for a, b in merges):
        doc["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    else:
        doc["model"]["merges"] = [[a, b] for a, b in merges]
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def _added(i: int, content: str, special: bool) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def _sentencepiece(metadata, tokens, arch):
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    if arch in _GEMMA_ARCHS:
        # Whitespace-run tokens are stored as real spaces; the normalizer turns spaces into "▁" first.
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        order = {t: -i for i, t in enumerate(tokens)}  # merge order = file order, not scores
        prefix = False
    else:
        scores = metadata.get("tokenizer.ggml.scores")
        order = ({t: -i for i, t in enumerate(tokens)} if scores is None
                 else dict(zip(tokens, (float(s) for s in scores))))
        prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    tok = Tokenizer(BPE(vocab={}, merges=[], unk_token=unk, fuse_unk=True, byte_fallback=True, dropout=None))
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if arch in _GEMMA_ARCHS:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    elif arch == "phi3":  # prefix space from a normalizer (transformers' phi3 builder)
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False)
        if prefix:
            steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    return tok, tokens, merges_from_vocab(tokens, order), None


def merges_from_vocab(tokens: list[str], order: Mapping[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a vocabulary: every split of a token into two tokens, best `order` first.

    Same result as transformers' `generate_merges(vocab, vocab_scores=order)`: sorted by (score, len(left),
    len(right)) descending, ties kept in vocabulary order.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for merge, score in order.items():
        local = [(merge[:k], merge[k:], score) for k in range(1, len(merge))
                 if merge[:k] in vocab and merge[k:] in vocab]
        if len(local) > 1:
            local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level alphabet)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _byte_level(metadata, tokens):
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # Tokens written as raw text (some converters do so for added tokens) are respelled in the alphabet.
    tokens = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
    raw = metadata.get("tokenizer.ggml.merges")
    if raw is None:
        raise ModelLoadError("byte-level (gpt2) GGUF tokenizer without tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in raw]
    pre = metadata.get("tokenizer.ggml.pre")
    tok = Tokenizer(BPE(vocab={}, merges=[], dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
                        fuse_unk=False, ignore_merges=pre in _LLAMA3_PRES))
    split = PRE_TOKENIZER_SPLITS.get(pre)
    if split is None:  # GPT-2's own regex
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok, tokens, merges, alphabet


def _gemma4(metadata, tokens):
    raw = metadata.get("tokenizer.ggml.merges")
    if raw is None:
        raise ModelLoadError("gemma4 GGUF tokenizer without tokenizer.ggml.merges")
    merges = []
    for m in raw:  # llama.cpp splits each merge at its first space after the first character
        pos = m.find(" ", 1)
        merges.append((m[:pos], m[pos + 1:]) if pos >= 0 else ("", ""))
    tok = Tokenizer(BPE(vocab={}, merges=[], dropout=None, fuse_unk=False, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("\n+"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    vocab = set(tokens)  # a merge must lead from tokens to a token (the tokenizers library refuses others)
    return tok, tokens, [(a, b) for a, b in merges if a in vocab and b in vocab and a + b in vocab], None


def _wordpiece(metadata, tokens):
    """BERT's WordPiece from llama.cpp's phantom-space vocabulary (see the module docstring)."""
    def spelled(t: str) -> str:
        if t.startswith("[") and t.endswith("]"):
            return t
        return t[1:] if t.startswith("\u2581") else "##" + t
    vocab_tokens = [spelled(t) for t in tokens]
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = vocab_tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else "[UNK]"
    tok = Tokenizer(WordPiece(vocab={t: i for i, t in enumerate(vocab_tokens)}, unk_token=unk))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    cls_id = metadata.get("tokenizer.ggml.cls_token_id", metadata.get("tokenizer.ggml.bos_token_id"))
    sep_id = metadata.get("tokenizer.ggml.seperator_token_id", metadata.get("tokenizer.ggml.eos_token_id"))
    if isinstance(cls_id, int) and isinstance(sep_id, int):
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return tok, vocab_tokens, [], None


def _unigram(metadata, tokens):
    """SentencePiece's Unigram from llama.cpp's UGM ("t5") keys (see the module docstring)."""
    scores = metadata.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise ModelLoadError("t5 (Unigram) GGUF tokenizer without one tokenizer.ggml.scores entry per token")

    def token_id(key, default=None):  # an id the file names, or llama.cpp's UGM default where it names none
        i = metadata.get(f"tokenizer.ggml.{key}_token_id", default)
        return i if isinstance(i, int) and 0 <= i < len(tokens) else None
    tok = Tokenizer(Unigram([(t, float(sc)) for t, sc in zip(tokens, scores)], unk_id=token_id("unknown", 2),
                            byte_fallback=False))
    charsmap = metadata.get("tokenizer.ggml.precompiled_charsmap")
    if charsmap is not None and len(charsmap):
        tok.normalizer = normalizers.Precompiled(bytes(bytearray(int(b) & 0xFF for b in charsmap)))
    prepend = "always" if metadata.get("tokenizer.ggml.add_space_prefix", False) else "never"
    meta = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend, split=True)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), meta])
                         if metadata.get("tokenizer.ggml.remove_extra_whitespaces", False) else meta)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    ids = {"bos": token_id("bos"), "eos": token_id("eos", 1), "seperator": token_id("seperator")}
    flags = {k: bool(metadata.get(f"tokenizer.ggml.add_{k}_token", d)) and ids[i] is not None
             for k, i, d in (("bos", "bos", False), ("eos", "eos", True), ("sep", "seperator", False))}
    if flags["bos"] or flags["eos"]:  # llama.cpp's UGM defaults: no BOS, EOS
        single = ("[BOS]:0 " if flags["bos"] else "") + "$A:0" + (" [EOS]:0" if flags["eos"] else "")
        pair = single + (" [SEP]:0" if flags["sep"] else "") + " $B:0" + (" [EOS]:0" if flags["eos"] else "")
        special = [{"id": f"[{n}]", "ids": [ids[k]], "tokens": [tokens[ids[k]]]}
                   for n, k, f in (("BOS", "bos", "bos"), ("EOS", "eos", "eos"), ("SEP", "seperator", "sep"))
                   if flags[f]]
        tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
    return tok, tokens, [], None


def _set_post_processor(tok: Tokenizer, metadata, tokens) -> None:
    bos_id = metadata.get("tokenizer.ggml.bos_token_id")
    eos_id = metadata.get("tokenizer.ggml.eos_token_id")
    add_bos = add_bos_default(metadata) and isinstance(bos_id, int)
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and isinstance(eos_id, int)
    if not (add_bos or add_eos):
        return
    # Template names are labels only; ids are what is inserted.
    single = ("[BOS]:0 " if add_bos else "") + "$A:0" + (" [EOS]:0" if add_eos else "")
    pair = single + (" [BOS]:1" if add_bos else "") + " $B:1" + (" [EOS]:1" if add_eos else "")
    special = ([{"id": "[BOS]", "ids": [bos_id], "tokens": [tokens[bos_id]]}] if add_bos else []) + \
              ([{"id": "[EOS]", "ids": [eos_id], "tokens": [tokens[eos_id]]}] if add_eos else [])
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
