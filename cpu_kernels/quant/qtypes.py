"""Weight types: GGUF's GGMLQuantizationType plus ramlm's own block types for formats GGUF has no type for.

A ramlm type is a block format like GGUF's (block_size values in type_size bytes per row), so every layer that
sizes, slices or stacks GGUF rows (the planner, the HF loader, stacked experts) handles it unchanged. Its
values start at 1000, far from GGML's ids; it is never written into a GGUF file.
"""
from __future__ import annotations

from enum import IntEnum

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


class RamlmType(IntEnum):
    # HF FP8 checkpoints (quant_method fp8, compressed-tensors float-quantized): per 128 values of a row, a float32
    # scale then 128 float8 e4m3fn bytes; value = e4m3(byte) * scale. Block-wise 128x128, per-channel and per-tensor
    # scales all become this row layout (a scale per 128 values of every row: 3 % over the file's bytes).
    FP8_E4M3 = 1000
    # Asymmetric 8-bit HF checkpoints (GPTQ sym: false, compressed-tensors asymmetric W8): per 32 values of a row, an
    # fp16 scale d, a zero point z (uint8), then 32 unsigned values q; value = d * (q - z). q - z spans -255..255, more
    # than Q8_0's int8 holds, so the zero point stays in the block (8.75 bits a weight).
    U8_ZP = 1001
    # Symmetric 8-bit weight-only HF checkpoints (GPTQ 8-bit, compressed-tensors W8A16): Q8_0's blocks, whose GEMV keeps
    # the activations to 16-bit precision as vLLM's W8A16 kernels do (k_a16.py; U8_ZP's GEMV does the same).
    Q8_A16 = 1002


FP8_BLOCK = 128
U8_ZP_BYTES = 35
QUANT_SIZES: dict = {**GGML_QUANT_SIZES, RamlmType.FP8_E4M3: (FP8_BLOCK, 4 + FP8_BLOCK),
                     RamlmType.U8_ZP: (32, U8_ZP_BYTES), RamlmType.Q8_A16: GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]}


def qtype(t) -> GGMLQuantizationType | RamlmType:
    """The enum member of a weight type id (GGML's or ramlm's); ValueError for an unknown id."""
    try:
        return GGMLQuantizationType(t)
    except ValueError:
        return RamlmType(t)


def e4m3_to_f32(b: np.ndarray) -> np.ndarray:
    """float8 e4m3fn bytes -> float32 from the format's definition (sign, 4-bit exponent biased by 7, 3-bit
    mantissa, subnormals at exponent 0; 0x7F/0xFF are NaN): the oracle the kernels are tested against."""
    b = np.asarray(b, np.uint8)
    e = ((b >> 3) & 15).astype(np.int32)
    m = (b & 7).astype(np.float64)
    mag = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * np.exp2(e - 7.0))
    mag = np.where((b & 0x7F) == 0x7F, np.nan, mag)
    return np.where(b & 0x80, -mag, mag).astype(np.float32)


def fp8_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """e4m3 bytes q uint8 (N, K) and float32 scales (N, K / 128) -> FP8_E4M3 rows uint8 (N, K / 128 * 132)."""
    N, K = q.shape
    if K % FP8_BLOCK or scale.shape != (N, K // FP8_BLOCK):
        raise ValueError(f"fp8_rows: q {q.shape} and scales {scale.shape} do not make 128-value blocks")
    out = np.empty((N, K // FP8_BLOCK, 4 + FP8_BLOCK), np.uint8)
    out[..., :4] = np.ascontiguousarray(scale, np.float32).view(np.uint8).reshape(N, -1, 4)
    out[..., 4:] = q.reshape(N, -1, FP8_BLOCK)
    return out.reshape(N, -1)


def dequantize(raw: np.ndarray, t) -> np.ndarray:
    """Any weight type's rows -> float32 values (gguf.quants.dequantize for GGML types: the oracle)."""
    t = qtype(t)
    if t == RamlmType.FP8_E4M3:
        b = np.asarray(raw, np.uint8).reshape(-1, 4 + FP8_BLOCK)
        scale = np.ascontiguousarray(b[:, :4]).view(np.float32)
        vals = (e4m3_to_f32(b[:, 4:]) * scale).astype(np.float32)
        return vals.reshape(*raw.shape[:-1], -1)
    if t == RamlmType.U8_ZP:
        b = np.asarray(raw, np.uint8).reshape(-1, U8_ZP_BYTES)
        d = np.ascontiguousarray(b[:, :2]).view(np.float16).astype(np.float32)
        vals = (b[:, 3:].astype(np.float32) - b[:, 2:3].astype(np.float32)) * d
        return vals.reshape(*raw.shape[:-1], -1)
    import gguf
    return gguf.quants.dequantize(raw, GGMLQuantizationType.Q8_0 if t == RamlmType.Q8_A16 else t)
