"""SpeculativeConfig: vLLM's speculative_config dict (method, num_speculative_tokens, prompt_lookup_min/max for ngram,
the suffix_decoding_* keys for suffix), checked as vLLM checks it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

METHODS = ("ngram", "suffix", "draft_model", "mtp")
LATER = ("eagle", "eagle3", "medusa")  # vLLM's other methods: not built yet
MAX_SPECULATIVE_TOKENS = 64
# Rows a decode step may hold, decodes and drafts together: the interleaved GEMV kernels share each weight load among
# rows, but past a handful a 2-core step is compute-bound and its cost grows with every row (bench.speculative
# --step-cost gives the curve per model).
SPEC_STEP_ROWS = 8
SUFFIX_DEFAULTS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
                   "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}  # vLLM's


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 0
    prompt_lookup_max: int = 0
    suffix_decoding_max_tree_depth: int = 24  # a tree's depth: the matched suffix and the draft together
    suffix_decoding_max_cached_requests: int = 10000  # recent requests whose outputs are kept; 0: none
    suffix_decoding_max_spec_factor: float = 1.0  # a draft is at most this times the matched suffix's length
    suffix_decoding_min_token_prob: float = 0.1  # a draft ends where its estimated probability falls below this
    model: Optional[str] = None  # draft_model: the draft's path (GGUF file or HF folder)
    quantization: Optional[str] = None  # draft_model: the draft's on-the-fly quantization (as the engine's)

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> Optional["SpeculativeConfig"]:
        """None for no speculation; ValueError naming what vLLM's keys cannot mean here."""
        if d is None:
            return None
        if not isinstance(d, dict):
            raise ValueError("speculative_config must be a JSON object")
        d = dict(d)
        method = d.pop("method", None)
        if method is None and d.get("model"):  # as vLLM guesses it
            method = "draft_model"
        elif method is None and {"prompt_lookup_max", "prompt_lookup_min"} & d.keys():
            method = "ngram"
        if method in LATER:
            raise ValueError(f"speculative_config.method {method!r} is not supported yet (supported: "
                             f"{', '.join(METHODS)})")
        if method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {', '.join(METHODS)}, got {method!r}")
        return {"ngram": cls._ngram, "suffix": cls._suffix, "draft_model": cls._draft_model, "mtp": cls._mtp}[method](d)

    @classmethod
    def _ngram(cls, d: dict) -> "SpeculativeConfig":
        k = d.pop("num_speculative_tokens", None)
        lo, hi = d.pop("prompt_lookup_min", None), d.pop("prompt_lookup_max", None)
        _no_more(d, "ngram")
        _check_k(k)
        if lo is None and hi is None:
            lo = hi = 5  # vLLM's defaults
        lo = hi if lo is None else lo  # vLLM: a missing bound takes the other's value
        hi = lo if hi is None else hi
        if not all(_is_int(v) for v in (lo, hi)) or not 1 <= lo <= hi:
            raise ValueError(f"speculative_config: need 1 <= prompt_lookup_min <= prompt_lookup_max, got {lo}, {hi}")
        return cls("ngram", k, lo, hi)

    @classmethod
    def _suffix(cls, d: dict) -> "SpeculativeConfig":
        kw = {key: d.pop(key, default) for key, default in SUFFIX_DEFAULTS.items()}
        depth, cached = kw["suffix_decoding_max_tree_depth"], kw["suffix_decoding_max_cached_requests"]
        factor, prob = kw["suffix_decoding_max_spec_factor"], kw["suffix_decoding_min_token_prob"]
        k = d.pop("num_speculative_tokens", None)
        _no_more(d, "suffix")
        if not _is_int(depth) or depth < 1:
            raise ValueError(f"speculative_config.suffix_decoding_max_tree_depth={depth!r} must be an integer >= 1")
        if not _is_int(cached) or cached < 0:
            raise ValueError(f"speculative_config.suffix_decoding_max_cached_requests={cached!r} must be an "
                             f"integer >= 0")
        if not _is_number(factor) or factor < 0:
            raise ValueError(f"speculative_config.suffix_decoding_max_spec_factor={factor!r} must be >= 0")
        if not _is_number(prob) or not 0 <= prob <= 1:
            raise ValueError(f"speculative_config.suffix_decoding_min_token_prob={prob!r} must be in [0, 1]")
        k = depth if k is None else k  # vLLM: the tree's depth bounds the draft anyway
        _check_k(k)
        return cls("suffix", k, suffix_decoding_max_tree_depth=depth, suffix_decoding_max_cached_requests=cached,
                   suffix_decoding_max_spec_factor=float(factor), suffix_decoding_min_token_prob=float(prob))


    @classmethod
    def _draft_model(cls, d: dict) -> "SpeculativeConfig":
        model, quantization = d.pop("model", None), d.pop("quantization", None)
        k = d.pop("num_speculative_tokens", None)
        _no_more(d, "draft_model")
        if not isinstance(model, str) or not model:
            raise ValueError("speculative_config.model (the draft model's path) is required for method 'draft_model'")
        _check_k(k)
        return cls("draft_model", k, model=model, quantization=quantization)


    @classmethod
    def _mtp(cls, d: dict) -> "SpeculativeConfig":
        k = d.pop("num_speculative_tokens", 1)  # vLLM: the checkpoint's MTP layers (one in these families)
        _no_more(d, "mtp")
        _check_k(k)
        return cls("mtp", k)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_k(k) -> None:
    if not _is_int(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"speculative_config.num_speculative_tokens must be an integer in "
                         f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")


def _no_more(d: dict, method: str) -> None:
    if d:
        raise ValueError(f"speculative_config: unknown or unsupported key(s) for method {method!r}: "
                         f"{', '.join(sorted(d))}")
