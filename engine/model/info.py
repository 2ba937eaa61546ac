"""`ramlm info MODEL`: what a model is and what it costs in memory, without touching tensor data."""
from __future__ import annotations

import math
import os
from typing import Any

from engine.core.kv_spec import is_paged, layout_bytes_per_block, layout_state_bytes
from engine.model.registry import architecture
from engine.model.weights import open_weights

KV_BYTES_PER_ELEMENT = 2  # fp16 KV cache, the default


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       bytes_per_element: int = KV_BYTES_PER_ELEMENT) -> int:
    """K and V for one token in every layer, full attention."""
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element


def model_info(path: str | os.PathLike) -> dict[str, Any]:
    """Describe a .gguf file or HF folder.

    Returns:
        dict with path, format, architecture, name, config (ModelConfig.to_dict()), num_tensors,
        num_params, tensor_types {type name: {"count", "bytes"}} (largest first), total_weight_bytes,
        kv_bytes_per_1k_tokens (fp16, the full-attention layers' caches as the runner allocates them,
        core/kv_spec.LayerKV: what grows with the context), kv_sliding_bytes_per_sequence (fp16, the sliding-window
        layers' window per sequence: bounded, they free the blocks that leave it), sliding_window_layers,
        kv_shared_layers (layers reading an earlier layer's cache, holding none), kv_note (what the KV figures count,
        for sliding-window, MLA, hybrid and KV-sharing models), state_bytes_per_sequence (the linear-attention layers'
        states of one sequence, core/kv_spec.LayerState; 0 without).
    Raises:
        ModelLoadError: as open_weights.
    """
    ws = open_weights(path)
    c = ws.config
    types: dict[str, dict[str, int]] = {}
    num_params = 0
    for name in ws.names():
        t = ws.info(name)
        entry = types.setdefault(t.ggml_type.name, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += t.nbytes
        num_params += math.prod(t.shape)
    types = dict(sorted(types.items(), key=lambda kv: -kv[1]["bytes"]))
    layout = architecture(c.arch).kv_layout(c)
    paged = [layer for layer in layout if is_paged(layer)]
    full = [layer for layer in paged if not layer.window]
    sliding = [layer for layer in paged if layer.window]
    kv_1k = layout_bytes_per_block(full, 1024, "fp16")  # what grows with the context
    # a sliding layer's cache group frees the blocks that leave its window: per sequence it holds about a window
    kv_seq = sum(layer.bytes_per_block(1, "fp16") * layer.window for layer in sliding)
    shared = sum(kv.shared_from >= 0 for kv in layout)
    note = "fp16 K and V, every layer at full attention"
    if any(layer.v_is_k for layer in paged):
        d = paged[0].head_dim
        note = (f"fp16 latent cache (MLA): per token and layer one row of {c.kv_lora_rank} latent + {d - c.kv_lora_rank}"
                " rope-key values, read as both K and V")
    if len(paged) < len(layout):
        note = (f"fp16 K and V of the {len(paged)} attention layers; the {len(layout) - len(paged)} "
                "linear-attention layers keep a fixed state per sequence instead")
    if sliding:
        windows = sorted({layer.window for layer in sliding})
        note = (f"fp16 K and V of the {len(full)} full-attention layers; the {len(sliding)} sliding-window layers "
                f"keep only their last {'/'.join(map(str, windows))} tokens per sequence: about {_bytes(kv_seq)} per "
                "sequence (plus a step's tokens), whatever its length")
    if shared:
        note += f"; {shared} layers read the K/V of earlier layers and hold none"
    return {
        "path": ws.path,
        "format": ws.format,
        "architecture": c.arch,
        "name": c.name,
        "config": c.to_dict(),
        "num_tensors": len(ws.names()),
        "num_params": num_params,
        "tensor_types": types,
        "total_weight_bytes": sum(v["bytes"] for v in types.values()),
        "kv_bytes_per_1k_tokens": kv_1k,
        "kv_bytes_per_1k_tokens_fp8": layout_bytes_per_block(full, 1024, "fp8"),  # --kv-cache-dtype fp8
        "kv_bytes_per_1k_tokens_int8": _int8_kv_bytes(full),  # --kv-cache-dtype int8, None where it cannot run
        "kv_sliding_bytes_per_sequence": kv_seq,
        "sliding_window_layers": len(sliding),
        "kv_shared_layers": shared,
        "kv_note": note,
        "state_bytes_per_sequence": layout_state_bytes(layout),  # float32 states of the linear-attention layers (0: none)
    }


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return ""  # unreachable


def _count(n: int) -> str:
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def _int8_kv_bytes(layout) -> int | None:
    try:
        return layout_bytes_per_block(layout, 1024, "int8")
    except ValueError:  # a head_dim q8_0 blocks cannot cover
        return None


def format_info(info: dict[str, Any]) -> str:
    """Human-readable text of model_info's dict."""
    c = info["config"]
    rs = c["rope_scaling"]
    rope = f"theta {c['rope_theta']:g}"
    if c.get("rope_theta_local"):
        rope += f" (local {c['rope_theta_local']:g})"
    rope += ", neox" if c["rope_neox"] else ", normal"
    if rs["type"] != "none":
        rope += f", {rs['type']} scaling x{rs['factor']:g}"
    from engine.model.architecture import Architecture
    from engine.model.registry import architecture
    arch = architecture(c["arch"])
    if type(arch).absolute_embedding is not Architecture.absolute_embedding:  # BERT: no rotation at all
        rope = f"none (learned absolute positions, {c['type_vocab_size']} token types)"
    norm = "layer-norm eps" if not arch.final_norm else "rms eps"  # post-norm LayerNorm models end normed
    head = f"tied embeddings {'yes' if c['tie_word_embeddings'] else 'no'}"
    if c["bidirectional"]:  # an encoder: no output matrix is used, the rows are pooled
        head = f"encoder (attends both ways), pooling {c['pooling_type'] or 'LAST'}"
    windows = list(c["layer_sliding_window"])
    attn = f"{c['num_heads']} heads, {c['num_kv_heads']} kv heads, head_dim {c['head_dim']}"
    if c.get("head_dim_global"):  # Gemma 4's full-attention layers
        attn += (f" (full layers: {c['num_kv_heads_global'] or c['num_kv_heads']} kv heads, head_dim "
                 f"{c['head_dim_global']})")
    if c.get("kv_lora_rank"):  # MLA
        q = f"q_lora_rank {c['q_lora_rank']}" if c["q_lora_rank"] else "plain q"
        attn = (f"MLA, {c['num_heads']} heads of {c['head_dim']} (rope {c['rope_dim']}), value_dim "
                f"{c['value_head_dim']}, {q}, kv_lora_rank {c['kv_lora_rank']}")
    lines = [
        f"model:          {info['path']} ({info['format']})",
        f"name:           {info['name'] or '-'}",
        f"architecture:   {info['architecture']}",
        f"parameters:     {_count(info['num_params'])} in {info['num_tensors']} tensors",
        f"layers:         {c['num_layers']}, hidden {c['hidden_size']}, ffn {c['intermediate_size']}, "
        f"vocab {c['vocab_size']}",
        f"attention:      {attn}",
    ]
    if any(windows):
        lines.append(f"sliding window: {max(windows)} on {info['sliding_window_layers']} of "
                     f"{c['num_layers']} layers")
    if c["num_experts"]:
        lines.append(f"experts:        {c['num_experts']} ({c['num_experts_per_tok']} per token), "
                     f"expert ffn {c['moe_intermediate_size']}")
    lines += [
        f"rope:           {rope}",
        f"context:        {c['max_position_embeddings']}",
        f"activation:     {c['hidden_act']}, {norm} {c['rms_norm_eps']:g}, {head}",
        "tensor types:",
    ]
    for name, t in info["tensor_types"].items():
        lines.append(f"  {name:<8} {t['count']:>5} tensors  {_bytes(t['bytes']):>12}")
    lines += [
        f"weights:        {_bytes(info['total_weight_bytes'])}",
        f"KV cache:       {_bytes(info['kv_bytes_per_1k_tokens'])} per 1k tokens ({info['kv_note']}); "
        f"{_bytes(info['kv_bytes_per_1k_tokens_fp8'])} with --kv-cache-dtype fp8, " + (
            f"{_bytes(info['kv_bytes_per_1k_tokens_int8'])} with int8" if info["kv_bytes_per_1k_tokens_int8"]
            else "int8 needs a head_dim that is a multiple of 32"),
    ]
    if info.get("state_bytes_per_sequence"):
        lines.append(f"states:         {_bytes(info['state_bytes_per_sequence'])} per sequence (float32 conv and "
                     "recurrent states; prefix-cache checkpoints take as much each)")
    return "\n".join(lines)
