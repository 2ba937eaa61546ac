"""Quantized HF checkpoints: config.json's quantization_config and the scale tensors that go with each weight.

FP8 (float8 e4m3fn weights) in the two layouts published checkpoints use:
- quant_method "fp8" (Qwen3.x-FP8, DeepSeek-V3): `weight_block_size` [bn, bk] with `<name>.weight_scale_inv`
  float32 (ceil(N / bn), ceil(K / bk)); without a block size, a per-tensor `<name>.weight_scale`.
- quant_method "compressed-tensors", format "float-quantized" (llm-compressor's FP8): `<name>.weight_scale` with
  strategy tensor (one value), channel (N, 1) or block (ceil(N / bn), ceil(K / bk)).
In both, value = e4m3(weight) * scale. Weights become RamlmType.FP8_E4M3 rows (a scale per 128 values of a row), so
K must be a multiple of 128 and a block's width a multiple of 128. Activations stay float32 on the CPU (vLLM
quantizes them to FP8 for FP8 tensor cores; a static `input_scale` is read and checked, not applied).
Layers left unquantized (`ignore`, `modules_to_not_convert`) are plain F32/F16/BF16 tensors and load as such.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cpu_kernels.quant.qtypes import FP8_BLOCK, fp8_rows
from engine.errors import ModelLoadError

# Tensors that ride along with a quantized weight: read with it, never mapped on their own.
SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale")
AUX_SUFFIXES = SCALE_SUFFIXES + ("input_scale",)
SUPPORTED = "fp8 (e4m3, block-wise or per-tensor), compressed-tensors float-quantized (FP8 W8A8/W8A16)"


@dataclass(frozen=True)
class FP8Scheme:
    """How a folder's FP8 weights are scaled: block (bn, bk) for block-wise scales, None where the scale's shape
    says it (one value per tensor, or one per output row)."""
    block: tuple[int, int] | None
    method: str


def _fail(source: str, reason: str):
    raise ModelLoadError(f"{source}: quantization_config: {reason}")


def _block(value, source: str, key: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        _fail(source, f"{key} must be two positive integers, got {value!r}")
    if value[1] % FP8_BLOCK:
        _fail(source, f"{key} {list(value)}: block widths that are not a multiple of {FP8_BLOCK} are not supported")
    return int(value[0]), int(value[1])


def _compressed_tensors(qc: dict, source: str) -> FP8Scheme:
    fmt = qc.get("format")
    groups = qc.get("config_groups")
    if fmt != "float-quantized":
        _fail(source, f"compressed-tensors format {fmt!r} is not supported yet (supported: {SUPPORTED})")
    if not isinstance(groups, dict) or not groups:
        _fail(source, "compressed-tensors without config_groups")
    blocks = set()
    for name, g in groups.items():
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            _fail(source, f"config_groups.{name} has no weights entry")
        if w.get("type") != "float" or w.get("num_bits") != 8:
            _fail(source, f"config_groups.{name}: {w.get('num_bits')}-bit {w.get('type')} weights are not supported "
                          f"yet (supported: {SUPPORTED})")
        strategy = w.get("strategy")
        if strategy not in ("tensor", "channel", "block"):
            _fail(source, f"config_groups.{name}: weight strategy {strategy!r} is not supported "
                          "(tensor, channel, block)")
        if w.get("symmetric") is False:
            _fail(source, f"config_groups.{name}: asymmetric FP8 weights are not supported")
        blocks.add(_block(w.get("block_structure"), source, f"config_groups.{name}.block_structure")
                   if strategy == "block" else None)
    if len(blocks) != 1:
        _fail(source, f"config_groups use different weight blocks {sorted(blocks, key=str)}")
    return FP8Scheme(blocks.pop(), "compressed-tensors")


def parse(config_json: dict, source: str = "config.json") -> FP8Scheme | None:
    """The folder's FP8 scheme; None for an unquantized folder or one whose architecture reads its own
    (gpt-oss's mxfp4). ModelLoadError for a malformed or unsupported quantization_config."""
    qc = config_json.get("quantization_config")
    if qc is None and isinstance(config_json.get("text_config"), dict):
        qc = config_json["text_config"].get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        _fail(source, f"not a JSON object ({type(qc).__name__})")
    method = qc.get("quant_method")
    if method == "mxfp4":
        return None
    if method == "fp8":
        if qc.get("fmt", "e4m3") != "e4m3":
            _fail(source, f"fp8 fmt {qc.get('fmt')!r} is not supported (e4m3)")
        if qc.get("activation_scheme", "dynamic") not in ("dynamic", "static"):
            _fail(source, f"activation_scheme {qc.get('activation_scheme')!r} is not dynamic or static")
        return FP8Scheme(_block(qc.get("weight_block_size"), source, "weight_block_size"), "fp8")
    if method == "compressed-tensors":
        return _compressed_tensors(qc, source)
    _fail(source, f"quant_method {method!r} is not supported yet (supported: {SUPPORTED})")


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
