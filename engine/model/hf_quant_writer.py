"""Write quantized HF checkpoints (FP8, GPTQ) in the layouts published ones have (no quantized checkpoint can be downloaded here, so
tests and benchmarks make their own from float models).

- "fp8-block": quant_method fp8 with weight_block_size [128, 128] and float32 `weight_scale_inv` (Qwen3.x-FP8,
  DeepSeek-V3): routed experts one module per expert, routers, norms, embeddings and lm_head left in float.
- "ct-channel" / "ct-tensor" / "ct-block": compressed-tensors float-quantized (llm-compressor's FP8_DYNAMIC and
  FP8_BLOCK schemes) with `weight_scale` per output row, per tensor or per 128x128 block.
- "gptq-4" / "gptq-8" / "gptq-4-asym" / "gptq-8-asym": GPTQ (AutoGPTQ's "gptq" checkpoint format), group 128: `qweight` int32
  packing the values along the input dim, `qzeros` (zero - 1, packed along the outputs), float16 `scales`, `g_idx`.
- "ct-w4a16" / "ct-w4a16-asym" / "ct-w8a16" / "ct-w8a16-asym" (compressed-tensors pack-quantized, group 128; W8A16
  per channel) and
  "ct-w8a8" (int-quantized, int8 weights per channel): llm-compressor's layouts, bfloat16 scales.
- "awq": AutoAWQ's gemm layout, 4-bit with zero points, group 128: `qweight` (K, N / 8) and `qzeros` packed along the
  outputs in the order 0, 2, 4, 6, 1, 3, 5, 7, float16 `scales`.
quantize_state_dict also returns the float values the checkpoint decodes to, for a reference model.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import zlib

import numpy as np

from cpu_kernels.quant.fp8_quant import E4M3_MAX, quantize_blockwise, to_e4m3

SCHEMES = ("fp8-block", "ct-channel", "ct-tensor", "ct-block", "gptq-4", "gptq-8", "gptq-4-asym", "gptq-8-asym",
           "gptq-4-actorder", "awq", "ct-w4a16", "ct-w4a16-asym", "ct-w4a16-actorder", "ct-w8a16", "ct-w8a16-asym",
           "ct-w8a8")
CT_INT = {"ct-w4a16": (4, True, 128, "pack-quantized"), "ct-w4a16-asym": (4, False, 128, "pack-quantized"),
          "ct-w4a16-actorder": (4, True, 128, "pack-quantized"),
          "ct-w8a16": (8, True, -1, "pack-quantized"), "ct-w8a16-asym": (8, False, 128, "pack-quantized"),
          "ct-w8a8": (8, True, -1, "int-quantized")}
GPTQ_GROUP = 128
_LINEAR = re.compile(r"(.*\.layers\.\d+\..*_proj(?:_[a-z_]+)?)\.weight$")  # q_proj, in_proj_qkv, kv_a_proj_with_mqa, ...
_FUSED = re.compile(r"(.*\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def _quantize(w: np.ndarray, scheme: str, scale_dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w f32 (N, K) -> (e4m3 bytes, scale as stored, the decoded float32 values)."""
    import torch
    N, K = w.shape
    if scheme in ("fp8-block", "ct-block"):
        q, scale = quantize_blockwise(w, (128, 128))
        full = np.repeat(np.repeat(scale, 128, axis=0), 128, axis=1)[:N, :K]
    else:
        amax = np.abs(w).max(axis=1, keepdims=True) if scheme == "ct-channel" else np.abs(w).max().reshape(1)
        scale = np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1)).astype(np.float32)
        scale = torch.from_numpy(scale).to(scale_dtype).to(torch.float32).numpy()  # as stored
        full = np.broadcast_to(scale.reshape(-1, 1) if scheme == "ct-channel" else scale, (N, K))
        q = to_e4m3(np.clip(w / full, -E4M3_MAX, E4M3_MAX))
    decoded = (torch.from_numpy(q).view(torch.float8_e4m3fn).to(torch.float32).numpy() * full).astype(np.float32)
    return q, scale, decoded


def _pack(vals: np.ndarray, bits: int, axis: int, order=None) -> np.ndarray:
    """uint values -> int32 words of 32 / bits values along axis (value j at bits j * bits; with order, slot i holds
    value order[i])."""
    per = 32 // bits
    v = np.moveaxis(vals.astype(np.uint32), axis, 0)
    v = v.reshape(v.shape[0] // per, per, *v.shape[1:])
    words = np.zeros(v.shape[:1] + v.shape[2:], np.uint32)
    for i in range(per):
        words |= v[:, order[i] if order else i] << np.uint32(bits * i)
    return np.moveaxis(words, 0, axis).view(np.int32)


def _int_quant(w: np.ndarray, bits: int, sym: bool, group: int = GPTQ_GROUP, bf16: bool = False):
    """w f32 (N, K) -> (q uint8 (N, K), zeros uint8 (G, N), scales (G, N) float16 (or bfloat16 bits as a torch
    tensor), decoded f32 (N, K)); group -1: one per row."""
    import torch
    N, K = w.shape
    group = K if group == -1 else group
    top = (1 << bits) - 1
    g = w.reshape(N, K // group, group)
    if sym:
        mid = 1 << (bits - 1)
        amax = np.abs(g).max(axis=-1)
        raw = np.where(amax > 0, amax / (mid - 1), 1.0)
    else:
        lo, hi = np.minimum(g.min(axis=-1), 0), np.maximum(g.max(axis=-1), 0)
        raw = np.where(hi > lo, (hi - lo) / top, 1.0)
    scale = torch.from_numpy(raw.astype(np.float32)).to(torch.bfloat16) if bf16 else raw.astype(np.float16)
    s32 = (scale.to(torch.float32).numpy() if bf16 else scale.astype(np.float32))
    if sym:
        zero = np.full(s32.shape, mid, np.int32)
    else:
        zero = np.clip(np.rint(-lo / s32), 0, top).astype(np.int32)
    s32 = s32[..., None]
    q = np.clip(np.rint(g / s32) + zero[..., None], 0, top).astype(np.uint8)
    decoded = ((q.astype(np.float32) - zero[..., None]) * s32).reshape(N, K)
    return q.reshape(N, K), zero.T.astype(np.uint8), (scale.T.contiguous() if bf16 else scale.T.copy()), decoded


def _act_order_quant(w: np.ndarray, bits: int, sym: bool, group: int, bf16: bool, act_order: bool):
    """_int_quant with act-order (desc_act / actorder "group"): the inputs grouped in a permuted order (GPTQ's, by
    Hessian diagonal, its own per weight; here a random one seeded by the weight's bytes) -> (q and decoded in the
    inputs' own order, zeros, scales, g_idx int32 (K,): each input's group)."""
    K = w.shape[1]
    group = K if group == -1 else group
    seed = zlib.crc32(np.ascontiguousarray(w).tobytes())
    perm = np.random.default_rng(seed).permutation(K) if act_order else np.arange(K)
    q, zero, scale, decoded = _int_quant(np.ascontiguousarray(w[:, perm]), bits, sym, group, bf16)
    g_idx = np.empty(K, np.int32)
    g_idx[perm] = np.arange(K) // group
    q_in, dec = np.empty_like(q), np.empty_like(decoded)
    q_in[:, perm], dec[:, perm] = q, decoded  # back to the inputs' own order, as checkpoints store them
    return q_in, zero, scale, dec, g_idx


def _ct_int(w: np.ndarray, scheme: str) -> tuple[dict, np.ndarray]:
    """w f32 (N, K) -> (the module's tensors by suffix, the decoded values): compressed-tensors int layouts."""
    import torch
    bits, sym, group, fmt = CT_INT[scheme]
    act_order = scheme.endswith("actorder")
    q, zero, scale, decoded, g_idx = _act_order_quant(w, bits, sym, group, True, act_order)
    off = 1 << (bits - 1)
    tensors = {"weight_scale": scale.T.contiguous()}  # (N, groups)
    if act_order:
        tensors["weight_g_idx"] = torch.from_numpy(g_idx)
    if fmt == "int-quantized":
        tensors["weight"] = torch.from_numpy((q.astype(np.int16) - off).astype(np.int8))
    else:  # stored value + 2^(bits - 1) = q, packed along the input dim
        tensors["weight_packed"] = torch.from_numpy(np.ascontiguousarray(_pack(q, bits, 1)))
        tensors["weight_shape"] = torch.tensor(w.shape)
    if not sym:  # signed zero point + 2^(bits - 1), packed along the outputs
        tensors["weight_zero_point"] = torch.from_numpy(np.ascontiguousarray(_pack(zero.T, bits, 0)))
    return {k: v.contiguous() for k, v in tensors.items()}, decoded


def _gptq(w: np.ndarray, bits: int, sym: bool = True, act_order: bool = False) -> tuple[dict, np.ndarray]:
    """w f32 (N, K) -> (the module's tensors by suffix, the decoded float32 values), GPTQ's layout (act_order:
    desc_act)."""
    import torch
    q, zero, scale, decoded, g_idx = _act_order_quant(w, bits, sym, GPTQ_GROUP, False, act_order)
    tensors = {"qweight": _pack(q.T, bits, 0), "qzeros": _pack(zero - 1, bits, 1),  # the "gptq" format: zero - 1
               "scales": scale, "g_idx": g_idx}
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}, decoded


def _awq(w: np.ndarray) -> tuple[dict, np.ndarray]:
    """w f32 (N, K) -> (the module's tensors by suffix, the decoded float32 values), AutoAWQ's gemm layout."""
    import torch
    from engine.model.hf_int import AWQ_ORDER
    q, zero, scale, decoded = _int_quant(w, 4, sym=False)
    tensors = {"qweight": _pack(q.T, 4, 1, AWQ_ORDER), "qzeros": _pack(zero, 4, 1, AWQ_ORDER), "scales": scale}
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}, decoded


def _eligible(w: np.ndarray) -> bool:
    return w.ndim == 2 and w.shape[1] % 128 == 0


def quantize_state_dict(sd: dict, scheme: str = "fp8-block", scale_dtype=None) -> tuple[dict, dict]:
    """sd: name -> torch tensor (a float HF model's state dict, transformers' in-memory names).

    Returns (the checkpoint's tensors: name -> torch tensor, float8 weights and their scales; sd with every quantized
    weight replaced by the float32 values the checkpoint decodes to)."""
    import torch
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    scale_dtype = scale_dtype or torch.float32
    suffix = "weight_scale_inv" if scheme == "fp8-block" else "weight_scale"
    out, decoded = {}, dict(sd)

    def put(stem: str, w: np.ndarray) -> np.ndarray:
        if scheme in CT_INT:
            tensors, dec = _ct_int(w, scheme)
            out.update({f"{stem}.{k}": v for k, v in tensors.items()})
            return dec
        if scheme.startswith(("gptq", "awq")):
            tensors, dec = _awq(w) if scheme == "awq" else _gptq(w, int(scheme[5]), not scheme.endswith("asym"),
                                                                 scheme.endswith("actorder"))
            out.update({f"{stem}.{k}": v for k, v in tensors.items()})
            return dec
        q, scale, dec = _quantize(w, scheme, scale_dtype)
        out[f"{stem}.weight"] = torch.from_numpy(q).view(torch.float8_e4m3fn)
        stored = torch.float32 if scheme.endswith("block") else scale_dtype  # block scales: float32, as published
        out[f"{stem}.{suffix}"] = torch.from_numpy(np.ascontiguousarray(scale)).to(stored)
        return dec

    for name, t in sd.items():
        w = t.detach().to(torch.float32).numpy()
        if (m := _LINEAR.match(name)) and _eligible(w):
            decoded[name] = torch.from_numpy(put(m[1], w))
        elif (m := _FUSED.match(name)) and w.ndim == 3 and w.shape[2] % 128 == 0:
            # transformers' fused experts (E, N, K) -> one module per expert, as checkpoints hold them
            dec = np.empty_like(w)
            for e in range(w.shape[0]):
                if m[2] == "down_proj":
                    dec[e] = put(f"{m[1]}.{e}.down_proj", w[e])
                else:
                    half = w.shape[1] // 2
                    dec[e, :half] = put(f"{m[1]}.{e}.gate_proj", w[e, :half])
                    dec[e, half:] = put(f"{m[1]}.{e}.up_proj", w[e, half:])
            decoded[name] = torch.from_numpy(dec)
        else:
            out[name] = t.detach().contiguous()
    return out, decoded


def quantization_config(scheme: str) -> dict:
    """config.json's quantization_config for a scheme, as the published checkpoints write it."""
    if scheme == "fp8-block":
        return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
    if scheme.startswith("gptq"):
        return {"quant_method": "gptq", "bits": int(scheme[5]), "group_size": GPTQ_GROUP,
                "desc_act": scheme.endswith("actorder"),
                "sym": not scheme.endswith("asym"), "checkpoint_format": "gptq", "damp_percent": 0.01,
                "static_groups": False, "true_sequential": True}
    if scheme == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": GPTQ_GROUP, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": None}
    if scheme in CT_INT:
        bits, sym, group, fmt = CT_INT[scheme]
        acts = ({"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True, "symmetric": True}
                if fmt == "int-quantized" else None)
        return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
                "ignore": ["lm_head"],
                "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": acts, "weights": {
                    "num_bits": bits, "type": "int", "symmetric": sym, "dynamic": False,
                    "strategy": "channel" if group == -1 else "group", "group_size": None if group == -1 else group,
                    "actorder": "group" if scheme.endswith("actorder") else None}}}}
    strategy = scheme.removeprefix("ct-")
    return {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False,
                        "block_structure": [128, 128] if strategy == "block" else None},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True,
                                  "symmetric": True}}}}


def write_quantized_folder(src: str, dst: str, scheme: str = "fp8-block", scale_dtype=None) -> dict:
    """Quantize the float HF folder src (config.json + safetensors written by transformers) into dst in a SCHEMES
    layout.

    Returns the decoded state dict (quantize_state_dict's second value) keyed as src's tensors."""
    from safetensors.torch import load_file, save_file
    files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    sd = {}
    for f in files:
        sd.update(load_file(os.path.join(src, f)))
    tensors, decoded = quantize_state_dict(sd, scheme, scale_dtype)
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if not f.endswith(".safetensors") and f != "model.safetensors.index.json" and os.path.isfile(
                os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    with open(os.path.join(src, "config.json")) as fh:
        cfg = json.load(fh)
    cfg["quantization_config"] = quantization_config(scheme)
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return decoded
