"""FP8 HF checkpoints' weights (hf_quant.FP8Scheme) as ramlm's FP8_E4M3 rows.

FP8 (float8 e4m3fn weights) in the two layouts published checkpoints use:
- quant_method "fp8" (Qwen3.x-FP8, DeepSeek-V3): `weight_block_size` [bn, bk] with `<name>.weight_scale_inv`
  float32 (ceil(N / bn), ceil(K / bk)); without a block size, a per-tensor `<name>.weight_scale`.
- quant_method "compressed-tensors", format "float-quantized" (llm-compressor's FP8): `<name>.weight_scale` with
  strategy tensor (one value), channel (N, 1) or block (ceil(N / bn), ceil(K / bk)).
In both, value = e4m3(weight) * scale. Weights become RamlmType.FP8_E4M3 rows (a scale per 128 values of a row), so
K must be a multiple of 128 and a block's width a multiple of 128. Activations stay float32 on the CPU (vLLM
quantizes them to FP8 for FP8 tensor cores; a static `input_scale` is not applied).
"""
from __future__ import annotations

import math

import numpy as np

from cpu_kernels.quant.qtypes import FP8_BLOCK, RamlmType, fp8_rows
from engine.errors import ModelLoadError
from engine.model.hf_quant import SCALE_SUFFIXES, FP8Scheme


def entry(weights, src, gguf_name: str):
    """(RamlmType.FP8_E4M3, shape, load) for the F8_E4M3 weight src of HFWeights `weights` and its scale tensor."""
    f, key = src
    what = f"{f.path}: tensor '{key}' ({gguf_name})"
    if not isinstance(weights.quant, FP8Scheme):
        raise ModelLoadError(f"{what}: float8 weights in a folder whose config.json has no FP8 quantization_config")
    shape = f.entries[key][1]
    if len(shape) < 2 or 0 in shape:
        raise ModelLoadError(f"{what}: shape {shape} is not usable")
    stem = key.removesuffix("weight")
    scale_key = next((stem + s for s in SCALE_SUFFIXES if stem + s in weights.file_of), None)
    if not key.endswith("weight") or scale_key is None:
        raise ModelLoadError(f"{what}: missing scale tensor '{stem}{SCALE_SUFFIXES[0]}' (or '{stem}{SCALE_SUFFIXES[1]}')")
    sf = weights.file_of[scale_key]
    check_scale(sf.entries[scale_key][1], shape, weights.quant, f"{what}, scale '{scale_key}'")

    def load():
        _, q = weights.source_array((f, key))
        scale = row_scales(weights.float_array((sf, scale_key)), shape, weights.quant, what)
        return fp8_weight_rows(q, scale)
    return RamlmType.FP8_E4M3, shape, load


def _scale_layout(scale_shape: tuple[int, ...], shape: tuple[int, ...], scheme: FP8Scheme, what: str) -> str:
    """"tensor", "channel" or "block": how a scale of scale_shape covers a weight of shape (..., N, K)."""
    *lead, N, K = shape
    if K % FP8_BLOCK:
        raise ModelLoadError(f"{what}: FP8 rows of {K} values are not a multiple of {FP8_BLOCK}")
    if math.prod(scale_shape) == 1:
        return "tensor"
    if scale_shape in ((*lead, N, 1), (*lead, N)):
        return "channel"
    if scheme.block is not None and scale_shape == (*lead, -(-N // scheme.block[0]), -(-K // scheme.block[1])):
        return "block"
    raise ModelLoadError(f"{what}: scale of shape {tuple(scale_shape)} does not fit weight {tuple(shape)}"
                         + (f" with blocks {list(scheme.block)}" if scheme.block else ""))


def row_scales(scale: np.ndarray, shape: tuple[int, ...], scheme: FP8Scheme, what: str) -> np.ndarray:
    """A weight's scale tensor -> float32 (*shape[:-1], K / 128): the scale of every 128 values of every row.

    shape: the weight's (..., N, K). scale: one value, one per row ((..., N, 1) or (..., N)), or one per
    (bn, bk) block ((..., ceil(N / bn), ceil(K / bk))) with the scheme's block."""
    *lead, N, K = shape
    s = np.asarray(scale, np.float32)
    nb = K // FP8_BLOCK
    layout = _scale_layout(s.shape, shape, scheme, what)
    if layout == "tensor":
        return np.full((*lead, N, nb), s.reshape(()), np.float32)
    if layout == "channel":
        return np.ascontiguousarray(np.broadcast_to(s.reshape(*lead, N, 1), (*lead, N, nb)))
    bn, bk = scheme.block
    return np.ascontiguousarray(np.repeat(np.repeat(s, bn, axis=-2)[..., :N, :], bk // FP8_BLOCK, axis=-1)[..., :nb])


def check_scale(scale_shape: tuple[int, ...], shape: tuple[int, ...], scheme: FP8Scheme, what: str) -> None:
    """ModelLoadError (naming `what`) unless row_scales can use a scale of this shape."""
    _scale_layout(tuple(scale_shape), tuple(shape), scheme, what)


def fp8_weight_rows(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """e4m3 bytes (..., N, K) and row_scales' (..., N, K / 128) -> FP8_E4M3 rows uint8 (..., N, K / 128 * 132)."""
    *lead, N, K = q.shape
    rows = math.prod(lead) * N
    out = fp8_rows(np.asarray(q, np.uint8).reshape(rows, K), scales.reshape(rows, -1))
    return out.reshape(*lead, N, -1)
