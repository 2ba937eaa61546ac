"""GGUF metadata -> ModelConfig, following llama.cpp's reading of each architecture's keys.

llama3 RoPE scaling: llama.cpp's converter does not write a scaling type for llama3; it stores the per-frequency
divisors as the tensor `rope_freqs.weight` (D/2,) and the runtime divides each inverse frequency by them. So a
llama3 GGUF gives rope_scaling type 'none' here, and the model file must do
`inv_freq /= weights.raw("rope_freqs.weight")` whenever that tensor exists (ModelConfig has no field for it).
rope_scaling type 'llama3' is set only by the HF loader, from config.json, where no such tensor exists.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ModelLoadError
from engine.model.config import ModelConfig, RopeScaling
from engine.model.gguf import GGUFFile
from engine.model.registry import architecture

# Token texts llama.cpp also treats as end-of-generation when they are in the vocabulary.
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
              "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>")
# gpt-oss's harmony format: <|end|> closes a message (the analysis channel's too) and generation goes on; it
# stops at <|return|> or <|call|>. llama.cpp drops <|end|> from its EOG set when all three are in the vocabulary.
_HARMONY_STOPS = ("<|return|>", "<|call|>")


class _Meta:
    def __init__(self, gf: GGUFFile):
        self.gf, self.md, self.arch = gf, gf.metadata, gf.arch

    def get(self, suffix: str, default: Any = None, required: bool = False) -> Any:
        key = f"{self.arch}.{suffix}"
        if key not in self.md:
            if required:
                raise ModelLoadError(f"{self.gf.path}: missing required metadata '{key}'")
            return default
        return self.md[key]

    def num(self, suffix: str, default: Any = None, required: bool = False, kind=int) -> Any:
        v = self.get(suffix, default, required)
        if v is None:
            return None
        key = f"{self.arch}.{suffix}"
        if isinstance(v, np.ndarray):
            # Per-layer arrays (some converters write head counts that way): fine when all equal, or layer 0's value
            # where the architecture reads the whole array itself (Architecture.gguf_per_layer_keys).
            per_layer = v.size and suffix in architecture(self.arch).gguf_per_layer_keys
            if v.size == 0 or (not per_layer and not np.all(v == v.flat[0])):
                raise ModelLoadError(f"{self.gf.path}: metadata '{key}' varies per layer ({v.tolist()[:8]}...)"
                                     "; per-layer values are not supported")
            v = v.flat[0].item()
        if isinstance(v, (str, list)) or (kind is int and isinstance(v, float)):
            raise ModelLoadError(f"{self.gf.path}: metadata '{key}' should be a number, got {v!r}")
        return kind(v)


def _rope_scaling(m: _Meta) -> RopeScaling:
    stype = m.get("rope.scaling.type", "none")
    factor = m.num("rope.scaling.factor", 1.0, kind=float)
    if stype == "none" and m.get("rope.scale_linear") is not None:  # pre-2024 key
        stype, factor = "linear", m.num("rope.scale_linear", kind=float)
    if stype in ("none", "") or (stype == "linear" and factor == 1.0):
        return RopeScaling()
    orig = m.num("rope.scaling.original_context_length", 0)
    if stype == "linear":
        return RopeScaling(type="linear", factor=factor, original_max_position=orig)
    if stype == "yarn":
        return RopeScaling(type="yarn", factor=factor, original_max_position=orig,
                           beta_fast=m.num("rope.scaling.yarn_beta_fast", 32.0, kind=float),
                           beta_slow=m.num("rope.scaling.yarn_beta_slow", 1.0, kind=float),
                           attn_factor=m.num("rope.scaling.attn_factor", 1.0, kind=float))
    raise ModelLoadError(f"{m.gf.path}: rope scaling type '{stype}' is not supported "
                         "(supported: none, linear, yarn; llama3 comes as rope_freqs.weight)")


def _token_ids(gf: GGUFFile) -> tuple[int | None, tuple[int, ...]]:
    md = gf.metadata
    bos = md.get("tokenizer.ggml.bos_token_id")
    eos: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = md.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v not in eos:
            eos.append(v)
    tokens = md.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        wanted = set(_EOG_TEXTS)
        found: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t in wanted:
                found.setdefault(t, i)
                if i not in eos:
                    eos.append(i)
        if "<|end|>" in found and all(t in found for t in _HARMONY_STOPS):
            eos = [i for i in eos if i != found["<|end|>"]]
    return (bos if isinstance(bos, int) and not isinstance(bos, bool) else None), tuple(eos)


def _vocab_size(gf: GGUFFile, m: _Meta) -> int:
    # The logits width is what matters to the model: rows of output (or of token_embd when tied).
    for name in ("output.weight", "token_embd.weight"):
        if name in gf.tensors and len(gf.tensors[name].shape) == 2:
            return gf.tensors[name].shape[0]
    tokens = gf.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        return len(tokens)
    return m.num("vocab_size", required=True)


def config_from_gguf(gf: GGUFFile) -> ModelConfig:
    """Hyperparameters of a GGUF model.

    Args:
        gf: an opened GGUFFile.
    Returns:
        ModelConfig: the keys every architecture shares, then the architecture's own (Architecture.gguf_config).
    Raises:
        ModelLoadError: unsupported architecture or missing/malformed required metadata.
    """
    arch = architecture(gf.arch, gf.path)
    m = _Meta(gf)
    hidden = m.num("embedding_length", required=True)
    num_layers = m.num("block_count", required=True)
    num_heads = m.num("attention.head_count", required=True)
    num_kv_heads = m.num("attention.head_count_kv", num_heads)
    if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ModelLoadError(f"{gf.path}: head counts {num_heads}/{num_kv_heads} (q/kv) are not usable")
    head_dim = m.num("attention.key_length", hidden // num_heads)
    value_dim = m.num("attention.value_length", head_dim)
    rope_dim = m.num("rope.dimension_count", head_dim)
    if not 0 < rope_dim <= head_dim or rope_dim % 2:
        raise ModelLoadError(f"{gf.path}: rope.dimension_count {rope_dim} does not fit head_dim {head_dim}")
    bos, eos = _token_ids(gf)
    kw: dict[str, Any] = dict(
        arch=arch.name,
        vocab_size=_vocab_size(gf, m),
        hidden_size=hidden,
        intermediate_size=m.num("feed_forward_length", 0, required=arch.dense_ffn),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=m.num(arch.gguf_norm_eps_key, required=True, kind=float),
        rope_theta=m.num("rope.freq_base", 10000.0, kind=float),
        rope_scaling=_rope_scaling(m),
        rope_dim=rope_dim if rope_dim != head_dim else 0,
        max_position_embeddings=m.num("context_length", required=True),
        tie_word_embeddings="output.weight" not in gf.tensors,
        attn_logit_softcap=m.num("attn_logit_softcapping", 0.0, kind=float),
        final_logit_softcap=m.num("final_logit_softcapping", 0.0, kind=float),
        bos_token_id=bos,
        eos_token_ids=eos,
        name=str(gf.metadata.get("general.name", "")),
    )
    arch.gguf_config(m, kw)
    if value_dim != head_dim and "value_head_dim" not in kw:  # only an architecture that reads them itself (MLA)
        raise ModelLoadError(f"{gf.path}: key_length {head_dim} != value_length {value_dim} is not supported")
    return ModelConfig(**kw)
