"""MXFP4 as HF checkpoints store it (gpt-oss's quantization_config quant_method "mxfp4") <-> GGUF MXFP4 blocks.

HF: `*_blocks` uint8 (..., rows, K / 32, 16) and `*_scales` uint8 (..., rows, K / 32): rows are output features,
the 32-value groups run along the input, byte k holds element 2k (low nibble) and 2k + 1 (high nibble), and a value
is FP4_E2M1[code] * 2^(scale - 127) (transformers' integrations/mxfp4.py). GGUF (ggml's block_mxfp4): per group the
exponent byte, then 16 bytes whose low nibbles are elements 0..15 and high nibbles 16..31, value
kvalues[code] * 2^(e - 128) with kvalues = 2 * E2M1: the same number for e = scale. So only the nibbles move
(llama.cpp's converter, transform_nibble_layout); the exponent byte is copied.
"""
from __future__ import annotations

import numpy as np


def hf_to_gguf(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks uint8 (..., G, 16), scales uint8 (..., G) -> GGUF MXFP4 rows uint8 (..., G * 17)."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ValueError(f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not pair up")
    codes = np.empty(blocks.shape[:-1] + (32,), np.uint8)  # element order
    codes[..., 0::2] = blocks & 0x0F
    codes[..., 1::2] = blocks >> 4
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    out = np.concatenate([scales[..., None], qs], axis=-1)
    return np.ascontiguousarray(out).reshape(*scales.shape[:-1], -1)


def gguf_to_hf(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGUF MXFP4 rows uint8 (..., G * 17) -> (blocks uint8 (..., G, 16), scales uint8 (..., G)): hf_to_gguf's
    inverse (test writers build HF MXFP4 folders with it)."""
    b = np.asarray(raw, np.uint8).reshape(*raw.shape[:-1], -1, 17)
    codes = np.concatenate([b[..., 1:] & 0x0F, b[..., 1:] >> 4], axis=-1)  # element order
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return np.ascontiguousarray(blocks), np.ascontiguousarray(b[..., 0])
