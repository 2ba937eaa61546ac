"""SpeculativeConfig: vLLM's speculative_config dict (method, num_speculative_tokens, prompt_lookup_min/max)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

METHODS = ("ngram",)
LATER = ("suffix", "draft_model", "mtp", "eagle", "eagle3", "medusa")  # vLLM's other methods: not built yet
MAX_SPECULATIVE_TOKENS = 16
# Rows a decode step may hold, decodes and drafts together: the interleaved GEMV kernels share each weight load among
# rows, but past a handful a 2-core step is compute-bound and its cost grows with every row (bench.speculative
# --step-cost gives the curve per model).
SPEC_STEP_ROWS = 8


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> Optional["SpeculativeConfig"]:
        """None for no speculation; ValueError naming what vLLM's keys cannot mean here."""
        if d is None:
            return None
        if not isinstance(d, dict):
            raise ValueError("speculative_config must be a JSON object")
        d = dict(d)
        method = d.pop("method", "ngram" if "prompt_lookup_max" in d or "prompt_lookup_min" in d else None)
        if method in LATER:
            raise ValueError(f"speculative_config.method {method!r} is not supported yet (supported: ngram)")
        if method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {', '.join(METHODS)}, got {method!r}")
        k = d.pop("num_speculative_tokens", None)
        lo, hi = d.pop("prompt_lookup_min", None), d.pop("prompt_lookup_max", None)
        if d:
            raise ValueError(f"speculative_config: unknown or unsupported key(s) {', '.join(sorted(d))}")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config.num_speculative_tokens must be an integer in "
                             f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
        if lo is None and hi is None:
            lo = hi = 5  # vLLM's defaults
        lo = hi if lo is None else lo  # vLLM: a missing bound takes the other's value
        hi = lo if hi is None else hi
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or not 1 <= lo <= hi:
            raise ValueError(f"speculative_config: need 1 <= prompt_lookup_min <= prompt_lookup_max, got {lo}, {hi}")
        return cls(method, k, lo, hi)
