"""llama.cpp's GGUF LoRA files (convert_lora_to_gguf.py's layout): general.type "adapter", adapter.type "lora",
adapter.lora.alpha; per adapted weight W, W.lora_a (r, K) and W.lora_b (N, r) in numpy order (the embedding's lora_a
transposed: (V, r)); the scale is alpha / r (1 when alpha is 0), as llama.cpp applies it."""
from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize

from engine.errors import ModelLoadError
from engine.lora.adapter import EMBED, HEAD, LoRAError, scaled
from engine.model.gguf import open_gguf


def _matrix(f, name: str) -> np.ndarray:
    info = f.info(name)
    raw = f.raw(name)
    if info.ggml_type in (GT.F32, GT.F16):  # a copy: the adapter outlives the file's mapping
        return np.array(raw, dtype=np.float32).reshape(info.shape)
    if info.ggml_type == GT.BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info.shape)
    return dequantize(raw, info.ggml_type).reshape(info.shape)


def read(path: str, arch) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """GGUF weight name -> (A (r, K), B^T * scale (r, N)). Raises LoRAError."""
    try:
        f = open_gguf(path)
    except ModelLoadError as e:
        raise LoRAError(str(e)) from None
    try:
        meta = f.metadata
        if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
            raise LoRAError(f"{path}: not a GGUF LoRA adapter (general.type {meta.get('general.type')!r}, "
                            f"adapter.type {meta.get('adapter.type')!r})")
        if "adapter.alora.invocation_tokens" in meta:
            raise LoRAError(f"{path}: an activated LoRA (aLoRA, active after its invocation tokens) is not supported")
        if f.arch != arch.name:
            raise LoRAError(f"{path}: an adapter for {f.arch!r} models, not {arch.name!r}")
        alpha = float(meta.get("adapter.lora.alpha", 0.0))
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        names = set(f.tensors)
        for t in sorted(names):
            if t.endswith(".lora_a") or t.endswith(".lora_b"):
                continue
            raise LoRAError(f"{path}: tensor {t!r} is not a LoRA matrix (adapters with norms are not supported)")
        for t in sorted(n for n in names if n.endswith(".lora_a")):
            weight = t[:-len(".lora_a")]
            if weight + ".lora_b" not in names:
                raise LoRAError(f"{path}: {weight} has lora_a but no lora_b")
            a, b = _matrix(f, t), _matrix(f, weight + ".lora_b")
            if weight == EMBED:
                a = a.T
            if a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0]:
                raise LoRAError(f"{path}: {weight}: lora_a {a.shape} and lora_b {b.shape} are not a rank-r pair")
            out[weight] = scaled(a, b, alpha / a.shape[0] if alpha else 1.0)
        for t in names:
            if t.endswith(".lora_b") and t[:-len(".lora_b")] not in out:
                raise LoRAError(f"{path}: {t[:-len('.lora_b')]} has lora_b but no lora_a")
        return out
    finally:
        f.close()


def write(peft_folder: str, out_path: str, arch, config) -> str:
    """A PEFT folder as llama.cpp's converter writes it (float32 matrices). use_rslora's scale alpha / sqrt(r) is
    kept by writing alpha * sqrt(r) (llama.cpp scales by alpha / r), which needs one rank for every module."""
    import gguf

    from engine.lora import peft
    pairs, alpha, rslora = peft.read_raw(peft_folder, arch, config)
    if config.tie_word_embeddings and {HEAD, EMBED} & set(pairs):
        # no output matrix to adapt (llama.cpp's converter refuses it), and llama.cpp applies an embedding's update
        # to the tied output matrix as well, where its shapes do not fit (it aborts)
        raise LoRAError(f"{peft_folder}: the embedding or lm_head is adapted, but the base model ties them: a GGUF "
                        f"LoRA file cannot say which one (llama.cpp would apply it to both)")
    if rslora:
        ranks = {a.shape[0] for a, _ in pairs.values()}
        if len(ranks) != 1:
            raise LoRAError(f"{peft_folder}: use_rslora with ranks {sorted(ranks)}: one alpha cannot scale them all")
        alpha *= math.sqrt(ranks.pop())
    w = gguf.GGUFWriter(out_path, arch.name)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for name, (a, b) in sorted(pairs.items()):
        w.add_tensor(name + ".lora_a", np.ascontiguousarray(a.T if name == EMBED else a, dtype=np.float32))
        w.add_tensor(name + ".lora_b", np.ascontiguousarray(b, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path
