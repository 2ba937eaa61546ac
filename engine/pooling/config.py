"""PoolerConfig: how a pooling model turns hidden states into one vector: vLLM's pooler_config (pooling_type LAST,
MEAN or CLS, normalize), read from the model folder's sentence-transformers files where it has them (modules.json,
the pooling module's config.json, Dense projections after it, a Normalize module; any other module is refused),
else the model's own (BERT: CLS; a GGUF file's pooling_type) or vLLM's default for decoder models (LAST),
normalized; Matryoshka sizes from config.json (matryoshka_dimensions, is_matryoshka)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

POOLING_TYPES = ("LAST", "MEAN", "CLS")
# sentence-transformers Dense activations served (EmbeddingGemma's projections have none)
DENSE_ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Tanh": "tanh"}
_ST_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
_ST_MODES = {"pooling_mode_lasttoken": "LAST", "pooling_mode_mean_tokens": "MEAN", "pooling_mode_cls_token": "CLS"}


@dataclass(frozen=True)
class PoolerConfig:
    pooling_type: str = "LAST"
    normalize: bool = True
    matryoshka: bool = False
    matryoshka_dimensions: Optional[tuple[int, ...]] = None  # the sizes a model was trained for, when it says
    dense: tuple = ()  # sentence-transformers Dense modules after the pooling: (W (out, in) f64, bias or None, act)

    @classmethod
    def for_model(cls, path: str, override: Optional[dict] = None, default_type: str = "LAST") -> "PoolerConfig":
        kw = {"pooling_type": default_type, **_sentence_transformers(path), **_matryoshka(path)}
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
    dense = []
    for m in modules:
        kind = m.get("type", "").rsplit(".", 1)[-1]
        if kind not in _ST_MODULES:
            raise ValueError(f"{path}: the sentence-transformers module {m.get('type')!r} is not supported "
                             f"({', '.join(_ST_MODULES)})")
        if kind == "Dense":
            dense.append(_dense(os.path.join(path, m.get("path", ""))))
        if m.get("type", "").endswith("Pooling"):
            cfg = _read(os.path.join(path, m.get("path", "")), "config.json") or {}
            modes = [t for key, t in _ST_MODES.items() if cfg.get(key)]
            others = ("pooling_mode_max_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_mean_sqrt_len_tokens")
            if len(modes) != 1 or any(cfg.get(k) for k in others):
                raise ValueError(f"{path}: the sentence-transformers pooling {cfg} is not one of last, mean or cls")
            out["pooling_type"] = modes[0]
    out["dense"] = tuple(dense)
    return out


def _dense(folder: str) -> tuple:
    """A sentence-transformers Dense module: (W (out, in) float64, bias or None, activation name)."""
    import numpy as np
    cfg = _read(folder, "config.json") or {}
    act = DENSE_ACTIVATIONS.get(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"))
    if act is None:
        raise ValueError(f"{folder}: Dense activation {cfg.get('activation_function')!r} is not supported "
                         f"({', '.join(DENSE_ACTIVATIONS)})")
    st = os.path.join(folder, "model.safetensors")
    if os.path.isfile(st):
        from safetensors.torch import load_file
        weights = load_file(st)
    elif os.path.isfile(os.path.join(folder, "pytorch_model.bin")):
        import torch
        weights = torch.load(os.path.join(folder, "pytorch_model.bin"), map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"{folder}: a Dense module without model.safetensors or pytorch_model.bin")
    if "linear.weight" not in weights:
        raise ValueError(f"{folder}: a Dense module without linear.weight")
    w = np.ascontiguousarray(weights["linear.weight"].double().numpy())  # float64 once, as the pool is summed
    b = weights.get("linear.bias")
    if (cfg.get("in_features"), cfg.get("out_features")) not in ((None, None), (w.shape[1], w.shape[0])):
        raise ValueError(f"{folder}: linear.weight {tuple(w.shape)} does not match in/out_features")
    return w, (None if b is None else b.double().numpy()), act


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


HF_OVERRIDES = ("architectures", "classifier_from_token", "is_original_qwen3_reranker", "method")


def check_hf_overrides(overrides: dict) -> None:
    """ValueError unless hf_overrides holds only what ramlm does with it: a causal LM served as a one-label classifier
    from two tokens' rows of its output matrix (vLLM's from_2_way_softmax)."""
    if not isinstance(overrides, dict):
        raise ValueError(f"hf_overrides must be a JSON object, got {type(overrides).__name__}")
    unknown = sorted(set(overrides) - set(HF_OVERRIDES))
    if unknown:
        raise ValueError(f"hf_overrides key(s) {', '.join(unknown)} are not supported (supported: "
                         f"{', '.join(HF_OVERRIDES)})")
    archs = overrides.get("architectures")
    if archs is not None and (not isinstance(archs, list) or len(archs) != 1
                              or not str(archs[0]).endswith("ForSequenceClassification")):
        raise ValueError(f"hf_overrides architectures {archs!r}: only one *ForSequenceClassification name is supported")
    tokens = overrides.get("classifier_from_token")
    two_way = overrides.get("is_original_qwen3_reranker") is True or overrides.get("method") == "from_2_way_softmax"
    if overrides.get("method") not in (None, "from_2_way_softmax"):
        raise ValueError(f"hf_overrides method {overrides['method']!r} is not supported (from_2_way_softmax)")
    if tokens is not None and (not two_way or not isinstance(tokens, list) or len(tokens) != 2
                               or not all(isinstance(t, str) for t in tokens)):
        raise ValueError("hf_overrides classifier_from_token: two token strings, with is_original_qwen3_reranker true "
                         "or method from_2_way_softmax (the only conversion supported)")
    if two_way and tokens is None:
        raise ValueError("hf_overrides: the two-way softmax needs classifier_from_token")


def default_runner(path: str, hf_overrides: dict | None = None) -> str:
    """runner="auto": pooling for a checkpoint whose config.json (or hf_overrides) names a sequence-classification
    architecture (it has no language-model head), generate otherwise."""
    cfg = _read(path, "config.json") if os.path.isdir(path) else None
    archs = (hf_overrides or {}).get("architectures") or (cfg or {}).get("architectures") or []
    return "pooling" if any(str(a).endswith("ForSequenceClassification") for a in archs) else "generate"
