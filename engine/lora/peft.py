"""PEFT LoRA folders (adapter_config.json + adapter_model.safetensors or .bin): the modules' A and B under the base
model's GGUF names, each scaled as PEFT scales it (lora_alpha / r, or / sqrt(r) with use_rslora)."""
from __future__ import annotations

import json
import math
import os

import numpy as np

from engine.lora.adapter import EMBED, HEAD, LoRAError, scaled
from engine.model import hf

_PREFIX = "base_model.model."
# (ending of an A tensor, ending of its B tensor, what the module is)
_PAIRS = ((".lora_A.weight", ".lora_B.weight"), (".lora_embedding_A", ".lora_embedding_B"))
_PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _config(folder: str) -> dict:
    path = os.path.join(folder, "adapter_config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise LoRAError(f"{folder}: no adapter_config.json (not a PEFT adapter folder)") from None
    except (OSError, ValueError) as e:
        raise LoRAError(f"{path}: unreadable ({e})") from None
    if not isinstance(cfg, dict) or str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise LoRAError(f"{path}: peft_type {cfg.get('peft_type')!r} is not LORA")
    refused = {"use_dora": "DoRA", "fan_in_fan_out": "fan_in_fan_out (Conv1D) weights",
               "alpha_pattern": "per-module alpha_pattern", "layer_replication": "layer_replication",
               "target_parameters": "LoRA on parameters (target_parameters)", "lora_bias": "LoRA biases",
               "modules_to_save": "modules_to_save (full copies of modules)",
               "alora_invocation_tokens": "activated LoRA (aLoRA)", "use_qalora": "QALoRA"}
    for key, what in refused.items():
        if cfg.get(key):
            raise LoRAError(f"{path}: {what} is not supported")
    if cfg.get("bias", "none") != "none":
        raise LoRAError(f"{path}: bias={cfg['bias']!r} is not supported (only 'none')")
    for key in ("r", "lora_alpha"):
        if not isinstance(cfg.get(key), (int, float)) or isinstance(cfg.get(key), bool) or cfg[key] <= 0:
            raise LoRAError(f"{path}: {key} must be a positive number, got {cfg.get(key)!r}")
    return cfg


def _tensors(folder: str) -> dict[str, np.ndarray]:
    st = os.path.join(folder, "adapter_model.safetensors")
    if os.path.isfile(st):
        from safetensors.numpy import load_file
        try:
            return load_file(st)
        except Exception as e:  # bf16 needs torch's reader; anything else is a broken file
            if "bf16" not in str(e).lower() and "bfloat16" not in str(e).lower():
                raise LoRAError(f"{st}: unreadable ({e})") from None
        from safetensors.torch import load_file as load_torch
        return {k: v.float().numpy() for k, v in load_torch(st).items()}
    binary = os.path.join(folder, "adapter_model.bin")
    if os.path.isfile(binary):
        import torch
        try:
            state = torch.load(binary, map_location="cpu", weights_only=True)
        except Exception as e:
            raise LoRAError(f"{binary}: unreadable ({e})") from None
        return {k: v.float().numpy() for k, v in state.items()}
    raise LoRAError(f"{folder}: no adapter_model.safetensors or adapter_model.bin")


def gguf_name(module: str, arch, config) -> str | None:
    """An HF module (model.layers.3.self_attn.q_proj, model.embed_tokens, lm_head) -> the GGUF weight it adapts, or
    None where the loader maps that weight in a way a low-rank update cannot follow (split or transformed)."""
    name = module + ".weight"
    for old, new in hf.PREFIXES:
        if name.startswith(old):
            name = new + name[len(old):]
    name = arch.hf_rename(name, config)
    if name == "model.embed_tokens.weight":
        return EMBED
    if name == "lm_head.weight":
        return HEAD
    m = hf.LAYER_RE.match(name)
    layer_map = {**hf.LAYER_MAP, **arch.hf_layer_map}
    if not m or layer_map.get(m[2]) not in _PROJECTIONS or arch.hf_split(config, f"{m[2]}.weight"):
        return None
    return f"blk.{m[1]}.{layer_map[m[2]]}.weight"


def read_raw(folder: str, arch, config) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], float, bool]:
    """(GGUF weight name -> (A (r, K), B (N, r)) as trained, B's rows in the GGUF weight's order; lora_alpha;
    use_rslora). Raises LoRAError."""
    cfg = _config(folder)
    tensors = _tensors(folder)
    pairs: dict[str, list] = {}
    for key, value in tensors.items():
        if key.endswith(".base_layer.weight"):  # PEFT saves an adapted embedding's base weights beside it
            continue
        for i, ending in enumerate(e for pair in _PAIRS for e in pair):
            if key.endswith(ending):
                module = key[:-len(ending)]
                module = module[len(_PREFIX):] if module.startswith(_PREFIX) else module
                pairs.setdefault(module, [None, None])[i % 2] = value
                break
        else:
            raise LoRAError(f"{folder}: tensor {key!r} is neither a LoRA A nor a LoRA B matrix")
    out = {}
    for module, (a, b) in pairs.items():
        if a is None or b is None:
            raise LoRAError(f"{folder}: {module} has {'no A' if a is None else 'no B'} matrix")
        name = gguf_name(module, arch, config)
        if name is None:
            raise LoRAError(f"{folder}: LoRA on {module} is not supported for {arch.name} models")
        a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0]:  # the embedding's A is (r, V), B (H, r) too
            raise LoRAError(f"{folder}: {module}: A {a.shape} and B {b.shape} are not a rank-r pair")
        if name not in (EMBED, HEAD) and arch.hf_transform(name, (b.shape[0], a.shape[1]), config) is not None:
            raise LoRAError(f"{folder}: LoRA on {module} is not supported for {arch.name} models (the loader "
                            f"transforms that weight)")
        base = name.split(".")[-2]
        if arch.hf_permute_qk and base in ("attn_q", "attn_k"):  # B's rows follow the weight's permuted rows
            heads = config.num_heads if base == "attn_q" else config.num_kv_heads
            b = hf.permute_qk(b, heads)
        out[name] = (a, b)
    return out, float(cfg["lora_alpha"]), bool(cfg.get("use_rslora"))


def read(folder: str, arch, config) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """GGUF weight name -> (A, B^T * scale) for every module of the adapter. Raises LoRAError."""
    pairs, alpha, rslora = read_raw(folder, arch, config)
    return {name: scaled(a, b, alpha / (math.sqrt(a.shape[0]) if rslora else a.shape[0]))
            for name, (a, b) in pairs.items()}
