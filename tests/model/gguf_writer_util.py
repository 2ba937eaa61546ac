"""Test helpers: write small GGUF files with gguf.GGUFWriter and find header fields to corrupt."""
from __future__ import annotations

import struct
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as GT, GGUFValueType as VT, GGUFWriter, GGML_QUANT_SIZES


def random_quant_bytes(rng: np.random.Generator, qtype: GT, shape: tuple[int, ...]) -> np.ndarray:
    """Random raw blocks of `qtype` for a tensor of element `shape` (numpy order): uint8 (*shape[:-1], row bytes)."""
    block, size = GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 256, size=(*shape[:-1], shape[-1] // block * size), dtype=np.uint8)


def write_gguf(path, arch: str, kv: list[tuple[str, Any, VT] | tuple[str, Any, VT, VT]],
               tensors: list[tuple[str, np.ndarray, GT | None]], alignment: int | None = None) -> None:
    """Write a GGUF file. kv: (key, value, type[, array item type]); tensors: (name, data, raw type or None).

    For quantized / BF16 tensors pass the raw bytes (uint8 / uint16) and the type."""
    w = GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for item in kv:
        key, val, vtype = item[:3]
        w.add_key_value(key, val, vtype, sub_type=item[3] if len(item) > 3 else None)
    for name, arr, raw_dtype in tensors:
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


TINY_TOKENS = ["<unk>", "<s>", "</s>", "hello", "wörld", "<0x0A>", "\u2581the", ""] + [f"t{i}" for i in range(56)]


def tiny_llama_tensors(rng: np.random.Generator, hidden=64, ffn=96, vocab=64, n_layers=2,
                       n_heads=4, n_kv=2) -> list[tuple[str, np.ndarray, GT | None]]:
    """A llama-shaped tensor set in mixed formats: F32 norms, F16, BF16, Q8_0, Q4_K (256-wide rows)."""
    hd = hidden // n_heads
    t: list[tuple[str, np.ndarray, GT | None]] = [
        ("token_embd.weight", random_quant_bytes(rng, GT.Q8_0, (vocab, hidden)), GT.Q8_0),
        ("output_norm.weight", rng.standard_normal(hidden).astype(np.float32), None),
        ("output.weight", rng.standard_normal((vocab, hidden)).astype(np.float16), None),
        ("rope_freqs.weight", np.linspace(1, 8, hd // 2).astype(np.float32), None),
    ]
    for i in range(n_layers):
        p = f"blk.{i}."
        t += [
            (p + "attn_norm.weight", rng.standard_normal(hidden).astype(np.float32), None),
            (p + "attn_q.weight", rng.standard_normal((n_heads * hd, hidden)).astype(np.float32), None),
            (p + "attn_k.weight", rng.integers(0, 65535, (n_kv * hd, hidden), dtype=np.uint16), GT.BF16),
            (p + "attn_v.weight", rng.standard_normal((n_kv * hd, hidden)).astype(np.float16), None),
            (p + "attn_output.weight", random_quant_bytes(rng, GT.Q8_0, (hidden, n_heads * hd)), GT.Q8_0),
            (p + "ffn_norm.weight", rng.standard_normal(hidden).astype(np.float32), None),
            (p + "ffn_gate.weight", random_quant_bytes(rng, GT.Q4_0, (ffn, hidden)), GT.Q4_0),
            (p + "ffn_up.weight", random_quant_bytes(rng, GT.Q4_K, (ffn, 256)), GT.Q4_K),
            (p + "ffn_down.weight", random_quant_bytes(rng, GT.Q6_K, (hidden, 256)), GT.Q6_K),
        ]
    return t


def tiny_llama_kv(arch="llama", hidden=64, ffn=96, n_layers=2, n_heads=4, n_kv=2, **extra) -> list:
    kv = [
        (f"{arch}.context_length", 2048, VT.UINT32),
        (f"{arch}.embedding_length", hidden, VT.UINT32),
        (f"{arch}.block_count", n_layers, VT.UINT32),
        (f"{arch}.feed_forward_length", ffn, VT.UINT32),
        (f"{arch}.attention.head_count", n_heads, VT.UINT32),
        (f"{arch}.attention.head_count_kv", n_kv, VT.UINT32),
        (f"{arch}.attention.layer_norm_rms_epsilon", 1e-5, VT.FLOAT32),
        (f"{arch}.rope.freq_base", 500000.0, VT.FLOAT32),
        ("general.name", "tiny", VT.STRING),
        ("tokenizer.ggml.model", "llama", VT.STRING),
        ("tokenizer.ggml.tokens", TINY_TOKENS, VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.scores", [float(-i) for i in range(len(TINY_TOKENS))], VT.ARRAY, VT.FLOAT32),
        ("tokenizer.ggml.token_type", [1] * len(TINY_TOKENS), VT.ARRAY, VT.INT32),
        ("tokenizer.ggml.bos_token_id", 1, VT.UINT32),
        ("tokenizer.ggml.eos_token_id", 2, VT.UINT32),
    ]
    for key, val in extra.items():
        kv.append(val if isinstance(val, tuple) else (key, val, VT.UINT32))
    return kv


def find_tensor_info(data: bytes, name: str) -> dict[str, Any]:
    """Byte positions of tensor `name`'s info record: n_dims, dims (list), type, offset."""
    enc = name.encode()
    pos = data.index(struct.pack("<Q", len(enc)) + enc) + 8 + len(enc)
    n_dims = struct.unpack_from("<I", data, pos)[0]
    dims = [pos + 4 + 8 * d for d in range(n_dims)]
    type_pos = pos + 4 + 8 * n_dims
    return {"n_dims": pos, "dims": dims, "type": type_pos, "offset": type_pos + 4}


def find_kv_value(data: bytes, key: str) -> int:
    """Byte position of key `key`'s value type field (the value follows it)."""
    enc = key.encode()
    return data.index(struct.pack("<Q", len(enc)) + enc) + 8 + len(enc)


def header_end(data: bytes, last_tensor: str) -> int:
    """Position just past the last tensor info record (before alignment padding)."""
    return find_tensor_info(data, last_tensor)["offset"] + 8
