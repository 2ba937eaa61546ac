"""Tokenizer: from GGUF metadata or an HF folder, with chat templates.

A thin layer over a `tokenizers.Tokenizer` (the backend) that adds what the engine needs: BOS/EOS ids,
the set of end-of-generation ids, special ids, and chat templating. GGUF building and caching live in
engine/tokenization/tokenizer_gguf.py, templates in engine/tokenization/chat_templates.py.

Rules worth knowing:
- encode(text) adds BOS when the model expects it (GGUF tokenizer.ggml.add_bos_token, llama.cpp's
  default when absent; HF: tokenizer.json's post-processor, or tokenizer_config's add_bos_token), and
  matches special tokens written in the text (like "<start_of_turn>") as single tokens. A text that
  already starts with the BOS token (a rendered chat template) gets no second BOS.
- all_special_ids: what decode(skip_special_tokens=True) drops: CONTROL tokens (GGUF token_type 3) and
  the named bos/eos/unk/pad tokens (HF: added tokens marked special). USER_DEFINED tokens (type 4: Gemma's
  "\\n", whitespace runs, "<start_of_image>") are matched whole but are ordinary text, not special.
- eos_token_ids (end of generation, llama.cpp's EOG set): eos_token_id first, then GGUF eot/eom ids,
  HF generation_config.json eos ids, and every vocabulary token named in EOG_TOKEN_TEXTS
  (Gemma's <end_of_turn>, Llama 3's <|eot_id|>, Qwen's <|im_end|> and <|endoftext|>, gpt-oss's <|return|> and
  <|call|>, ...), less <|end|> where <|return|> and <|call|> exist (gpt-oss's harmony format goes on after it).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from tokenizers import Tokenizer as _Backend
from tokenizers import processors

from engine.tokenization import chat_templates
from engine.errors import ModelLoadError
from engine.tokenization.tokenizer_gguf import CONTROL, add_bos_default, load_or_build

# Token texts llama.cpp treats as end of generation (same list as engine/model/gguf_config.py).
EOG_TOKEN_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                   "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>")
# gpt-oss's harmony format stops at <|return|> or <|call|>; its <|end|> closes a message (the analysis channel's
# too) and generation goes on, so with those two in the vocabulary <|end|> is no EOG (llama.cpp's rule).
HARMONY_STOP_TEXTS = ("<|return|>", "<|call|>")


class Tokenizer:
    """Encodes, decodes and renders chats for one model. Build with from_gguf_metadata or from_hf."""

    def __init__(self, backend: _Backend, *, bos_token_id: int | None, eos_token_id: int | None,
                 extra_eos_ids: Iterable[int] = (), unk_token_id: int | None = None,
                 pad_token_id: int | None = None, special_ids: Iterable[int] = (),
                 chat_template: str | dict | None = None, arch: str = "", vocab_size: int | None = None):
        self.backend = backend
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        self.unk_token_id, self.pad_token_id = unk_token_id, pad_token_id
        self.vocab_size = vocab_size if vocab_size is not None else backend.get_vocab_size(with_added_tokens=True)
        self.arch = arch
        eog = [] if eos_token_id is None else [eos_token_id]
        eog += sorted({int(i) for i in extra_eos_ids} | self._ids_of(EOG_TOKEN_TEXTS))
        end = self.backend.token_to_id("<|end|>")
        if end is not None and len(self._ids_of(HARMONY_STOP_TEXTS)) == len(HARMONY_STOP_TEXTS):
            eog = [i for i in eog if i != end]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eog))
        self.all_special_ids: set[int] = {int(i) for i in special_ids} | {
            i for i in (bos_token_id, eos_token_id, unk_token_id, pad_token_id) if i is not None}
        self.bos_token = self._text(bos_token_id)
        self.eos_token = self._text(eos_token_id)
        self.unk_token = self._text(unk_token_id)
        self.pad_token = self._text(pad_token_id)
        # Whether the backend's post-processor puts BOS in front (probed, so HF folders need no guessing).
        with_special = backend.encode("a", add_special_tokens=True).ids
        self.add_bos_token = (bos_token_id is not None and with_special[:1] == [bos_token_id]
                              and backend.encode("a", add_special_tokens=False).ids[:1] != [bos_token_id])
        self.chat_template = chat_template
        self.builtin_chat_template = chat_templates.builtin_template(arch, lambda t: backend.token_to_id(t) is not None)

    # ---- construction ----

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], cache_key: str | None = None) -> "Tokenizer":
        """A tokenizer from GGUF metadata (tokenizer.ggml.* keys, general.architecture, tokenizer.chat_template).

        Args:
            metadata: GGUFFile.metadata (string arrays as lists, numeric arrays as numpy arrays).
            cache_key: names the cached tokenizer.json (~/.cache/ramlm/tokenizers, or $RAMLM_CACHE_DIR);
                e.g. engine.tokenization.tokenizer_gguf.tokenizer_cache_key(path). None: build every time (seconds for
                a 262k vocabulary).
        Raises:
            ModelLoadError: missing or unsupported tokenizer metadata.
        """
        backend = load_or_build(metadata, cache_key)
        tokens = metadata["tokenizer.ggml.tokens"]

        def tid(key):
            v = metadata.get(f"tokenizer.ggml.{key}_token_id")
            return int(v) if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(tokens) else None

        types = metadata.get("tokenizer.ggml.token_type")
        special = [] if types is None else np.flatnonzero(np.asarray(types) == CONTROL).tolist()
        if metadata.get("tokenizer.ggml.model") == "gpt2":  # mislabelled controls are not tokens (see builder)
            special = [i for i in special if backend.id_to_token(i) is not None]
        if add_bos_default(metadata) and tid("bos") is None:
            raise ModelLoadError("GGUF tokenizer asks for BOS but has no valid tokenizer.ggml.bos_token_id")
        extra = [i for i in (tid("eot"), tid("eom")) if i is not None]
        return cls(backend, bos_token_id=tid("bos"), eos_token_id=tid("eos"), extra_eos_ids=extra,
                   unk_token_id=tid("unknown"), pad_token_id=tid("padding"), special_ids=special,
                   chat_template=metadata.get("tokenizer.chat_template"),
                   arch=metadata.get("general.architecture", ""), vocab_size=len(tokens))

    @classmethod
    def from_hf(cls, folder: str | os.PathLike) -> "Tokenizer":
        """A tokenizer from an HF folder: tokenizer.json, plus tokenizer_config.json (bos/eos, add_bos_token,
        chat_template), chat_template.jinja / chat_template.json, special_tokens_map.json,
        generation_config.json (eos ids) and config.json (model_type, for the built-in template).

        Raises:
            ModelLoadError: no tokenizer.json (SentencePiece-only folders are not converted).
        """
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder}: no tokenizer.json (tokenizer.model alone is not supported)")
        try:
            backend = _Backend.from_file(str(path))
        except Exception as e:
            raise ModelLoadError(f"{path}: cannot be read by tokenizers: {e}") from e
        cfg = _read_json(folder / "tokenizer_config.json")
        smap = _read_json(folder / "special_tokens_map.json")
        gen = _read_json(folder / "generation_config.json")
        model_cfg = _read_json(folder / "config.json")

        def named(name):
            v = cfg.get(name, smap.get(name))
            v = v.get("content") if isinstance(v, Mapping) else v
            return backend.token_to_id(v) if isinstance(v, str) else None

        bos, eos = named("bos_token"), named("eos_token")
        if bos is None and isinstance(gen.get("bos_token_id"), int) and "bos_token" not in cfg:
            bos = gen["bos_token_id"]
        gen_eos = gen.get("eos_token_id", model_cfg.get("eos_token_id"))
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        if eos is None and gen_eos:
            eos = gen_eos[0]
        if "add_bos_token" in cfg or "add_eos_token" in cfg:  # explicit flags rebuild the post-processor
            _set_bos_eos(backend, bos if cfg.get("add_bos_token") else None,
                         eos if cfg.get("add_eos_token") else None)
        special = [i for i, t in backend.get_added_tokens_decoder().items() if t.special]
        return cls(backend, bos_token_id=bos, eos_token_id=eos, extra_eos_ids=gen_eos,
                   unk_token_id=named("unk_token"), pad_token_id=named("pad_token"), special_ids=special,
                   chat_template=_hf_chat_template(folder, cfg), arch=model_cfg.get("model_type", ""))

    # ---- encode / decode ----

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in it are matched. With add_special_tokens, BOS (and
        EOS) as the model expects, but never a second BOS in front of one the text starts with."""
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos_token and ids[1:2] == [self.bos_token_id]:
            ids = ids[1:]
        return ids

    def encode_pair(self, first: str, second: str) -> tuple[list[int], list[int]]:
        """(token ids, token type ids) of two texts through the tokenizer's pair template (BERT: [CLS] a [SEP] b [SEP],
        b's tokens type 1; RoBERTa: <s> a </s></s> b </s>): a cross-encoder's input."""
        enc = self.backend.encode(first, second, add_special_tokens=True)
        return enc.ids, enc.type_ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int] | int) -> list[str] | str:
        """Vocabulary strings of ids (byte-level or "▁" spelling); a single id gives a single string."""
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: Sequence[str] | str) -> list[int | None] | int | None:
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(t) for t in tokens]

    def __len__(self) -> int:
        return self.vocab_size

    # ---- chat ----

    def get_chat_template(self, chat_template: str | None = None, tools=None) -> str:
        """The template in use: the argument, the model's own, else the built-in one for its architecture."""
        source = chat_templates.select_template(chat_template or self.chat_template, tools)
        source = source or self.builtin_chat_template
        if source is None:
            raise ValueError(f"no chat template: the model has none and there is no built-in one for "
                             f"architecture {self.arch!r}")
        return source

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False,
                            tools=None, chat_template: str | None = None, documents=None,
                            continue_final_message: bool = False, **kwargs):
        """Renders a chat, as transformers' apply_chat_template does.

        Args:
            messages: [{"role": ..., "content": ...}, ...]; any role the template accepts.
            add_generation_prompt: end with the assistant turn's header.
            continue_final_message: end inside the final message, for the model to continue it (a prefill);
                not together with add_generation_prompt.
            tokenize: return token ids instead of text. The text is encoded without adding special
                tokens (the template writes BOS itself); BOS is put in front only when the model expects
                one and the template did not write it.
            tools: tool JSON schemas, passed to the template.
            chat_template: a template (or template name) overriding the model's.
            **kwargs: extra template variables (e.g. enable_thinking).
        Returns:
            str, or list[int] with tokenize=True.
        """
        special = {"bos_token": self.bos_token, "eos_token": self.eos_token, "unk_token": self.unk_token,
                   "pad_token": self.pad_token}
        text = chat_templates.render(self.get_chat_template(chat_template, tools), messages,
                                     add_generation_prompt=add_generation_prompt,
                                     continue_final_message=continue_final_message, tools=tools,
                                     documents=documents, special_tokens={k: v for k, v in special.items() if v},
                                     **kwargs)
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        if self.add_bos_token and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id] + ids
        return ids

    # ---- helpers ----

    def _ids_of(self, texts: Iterable[str]) -> set[int]:
        return {i for i in map(self.backend.token_to_id, texts) if i is not None}

    def _text(self, i: int | None) -> str | None:
        return None if i is None else self.backend.id_to_token(i)

    def __repr__(self) -> str:
        return (f"Tokenizer(arch={self.arch!r}, vocab_size={self.vocab_size}, bos={self.bos_token!r}, "
                f"eos_ids={self.eos_token_ids}, add_bos={self.add_bos_token})")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not valid JSON: {e}") from e
    return data if isinstance(data, dict) else {}


def _hf_chat_template(folder: Path, cfg: Mapping) -> str | dict | None:
    """chat_template.jinja, else chat_template.json, else tokenizer_config.json's (str or list of named)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = _read_json(folder / "chat_template.json").get("chat_template", cfg.get("chat_template"))
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template}
    return template


def _set_bos_eos(backend: _Backend, bos: int | None, eos: int | None) -> None:
    """transformers' update_post_processor: BOS/EOS around each sequence as the flags say."""
    single = ("[BOS]:0 " if bos is not None else "") + "$A:0" + (" [EOS]:0" if eos is not None else "")
    pair = single + (" [BOS]:1" if bos is not None else "") + " $B:1" + (" [EOS]:1" if eos is not None else "")
    special = []
    if bos is not None:
        special.append({"id": "[BOS]", "ids": [bos], "tokens": [backend.id_to_token(bos)]})
    if eos is not None:
        special.append({"id": "[EOS]", "ids": [eos], "tokens": [backend.id_to_token(eos)]})
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
