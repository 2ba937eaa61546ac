"""PoolerConfig: how a pooling model turns hidden states into one vector: vLLM's pooler_config (pooling_type LAST,
MEAN or CLS, normalize), read from the model folder's sentence-transformers files where it has them (modules.json,
the pooling module's config.json, a Normalize module), else vLLM's default for decoder models (LAST, normalized);
Matryoshka sizes from config.json (matryoshka_dimensions, is_matryoshka)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

POOLING_TYPES = ("LAST", "MEAN", "CLS")
_ST_MODES = {"pooling_mode_lasttoken": "LAST", "pooling_mode_mean_tokens": "MEAN", "pooling_mode_cls_token": "CLS"}


@dataclass(frozen=True)
class PoolerConfig:
    pooling_type: str = "LAST"
    normalize: bool = True
    matryoshka: bool = False
    matryoshka_dimensions: Optional[tuple[int, ...]] = None  # the sizes a model was trained for, when it says

    @classmethod
    def for_model(cls, path: str, override: Optional[dict] = None) -> "PoolerConfig":
        kw = {**_sentence_transformers(path), **_matryoshka(path)}
        override = dict(override or {})
        for key in ("pooling_type", "normalize"):
            if key in override:
                kw[key] = override.pop(key)
        if override:
            raise ValueError(f"pooler_config: unknown or unsupported key(s) {', '.join(sorted(override))}")
        kw["pooling_type"] = str(kw.get("pooling_type", "LAST")).upper()
        if kw["pooling_type"] not in POOLING_TYPES:
            raise ValueError(f"pooler_config.pooling_type must be one of {', '.join(POOLING_TYPES)}, got "
                             f"{kw['pooling_type']!r}")
        if not isinstance(kw.get("normalize", True), bool):
            raise ValueError(f"pooler_config.normalize must be true or false, got {kw['normalize']!r}")
        return cls(**kw)


def _read(path: str, name: str) -> Optional[dict | list]:
    f = os.path.join(path, name)
    if not os.path.isfile(f):
        return None
    with open(f) as fh:
        return json.load(fh)


def _sentence_transformers(path: str) -> dict:
    if not os.path.isdir(path):
        return {}
    modules = _read(path, "modules.json")
    if not isinstance(modules, list):
        return {}
    out: dict = {"normalize": any(m.get("type", "").endswith("Normalize") for m in modules)}
    for m in modules:
        if m.get("type", "").endswith("Pooling"):
            cfg = _read(os.path.join(path, m.get("path", "")), "config.json") or {}
            modes = [t for key, t in _ST_MODES.items() if cfg.get(key)]
            others = ("pooling_mode_max_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_mean_sqrt_len_tokens")
            if len(modes) != 1 or any(cfg.get(k) for k in others):
                raise ValueError(f"{path}: the sentence-transformers pooling {cfg} is not one of last, mean or cls")
            out["pooling_type"] = modes[0]
    return out


def _matryoshka(path: str) -> dict:
    cfg = _read(path, "config.json") if os.path.isdir(path) else None
    if not isinstance(cfg, dict):
        return {}
    dims = cfg.get("matryoshka_dimensions")
    return {"matryoshka": bool(cfg.get("is_matryoshka") or dims),
            "matryoshka_dimensions": tuple(int(d) for d in dims) if dims else None}


def class_labels(path: str) -> list[str]:
    """A classification checkpoint's label names by class id (config.json's id2label; LABEL_i where it has none)."""
    cfg = _read(path, "config.json") if os.path.isdir(path) else None
    id2label = (cfg or {}).get("id2label") or {}
    n = max((int(k) for k in id2label), default=-1) + 1
    return [str(id2label.get(str(i), f"LABEL_{i}")) for i in range(n)]


def default_runner(path: str) -> str:
    """runner="auto": pooling for a checkpoint whose config.json names a sequence-classification architecture (it has
    no language-model head), generate otherwise."""
    cfg = _read(path, "config.json") if os.path.isdir(path) else None
    archs = (cfg or {}).get("architectures") or []
    return "pooling" if any(str(a).endswith("ForSequenceClassification") for a in archs) else "generate"
