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

GPTQ (quant_method "gptq", AutoGPTQ/GPTQModel's layout): `<name>.qweight` int32 (K / 32 * bits, N) packing `bits`-bit
values along the input dim (value of input row 32 i / bits + j at bits j * bits), `<name>.scales` float16 (K / g, N),
`<name>.qzeros` int32 (K / g, N / 32 * bits) packing zero points along the outputs (stored minus one in the "gptq"
checkpoint format, as they are in "gptq_v2"), `<name>.g_idx` int32 (K,); value = scale * (q - zero). Symmetric
checkpoints (every zero at 2^(bits - 1)) become GGUF blocks with the same numbers: 4-bit as Q4_0 (fp16 d = the group's
scale, q - 8), 8-bit as Q8_0 (q - 128): exact, and run by those formats' kernels (4.5 / 8.5 bits a weight against the
file's ~4.1 / 8.1). Groups must be whole 32-value blocks (32, 64, 128, ..., or -1: one group per row).
Not yet: asymmetric zero points, act-order with a g_idx that is not k // group_size, 2/3-bit.
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
SUPPORTED = ("fp8 (e4m3, block-wise or per-tensor), compressed-tensors float-quantized (FP8 W8A8/W8A16), gptq "
             "(4/8-bit symmetric)")
GPTQ_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")


@dataclass(frozen=True)
class GPTQScheme:
    """A GPTQ checkpoint: bits (4 or 8), group (values per scale along K; -1: the whole row), v2 zero points."""
    bits: int
    group: int
    v2: bool
    method: str = "gptq"


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


def _gptq(qc: dict, source: str) -> GPTQScheme:
    bits, group = qc.get("bits"), qc.get("group_size", 128)
    if bits not in (4, 8):
        _fail(source, f"gptq bits {bits!r} are not supported (4, 8)")
    if not isinstance(group, int) or isinstance(group, bool) or not (group == -1 or (group > 0 and group % 32 == 0)):
        _fail(source, f"gptq group_size {group!r} is not supported (a multiple of 32, or -1)")
    if qc.get("sym", True) is not True:
        _fail(source, "asymmetric GPTQ (sym: false) is not supported yet")
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        _fail(source, f"gptq checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
    return GPTQScheme(bits, group, fmt == "gptq_v2")


def parse(config_json: dict, source: str = "config.json") -> FP8Scheme | GPTQScheme | None:
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
    if method == "gptq":
        return _gptq(qc, source)
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


def _unpack(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """int32 words packing 32 / bits values each (value j at bits j * bits) -> uint8 values, unpacked along axis."""
    per = 32 // bits
    w = np.asarray(words).view(np.uint32)
    vals = np.stack([(w >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], axis=axis + 1)
    shape = list(w.shape)
    shape[axis] *= per
    return vals.reshape(shape).astype(np.uint8)


def gptq_shapes(qweight_shape: tuple, scheme: GPTQScheme, what: str) -> tuple[int, int, int]:
    """(N, K, groups) of a GPTQ weight from its qweight's shape; ModelLoadError if they do not fit the scheme."""
    if len(qweight_shape) != 2:
        raise ModelLoadError(f"{what}: qweight of shape {qweight_shape} is not 2-D")
    K, N = qweight_shape[0] * 32 // scheme.bits, qweight_shape[1]
    group = K if scheme.group == -1 else scheme.group
    if K % group or K % 32:
        raise ModelLoadError(f"{what}: {K} input values do not split into groups of {group} (and 32-value blocks)")
    return N, K, K // group


def gptq_rows(qweight, qzeros, scales, g_idx, scheme: GPTQScheme, what: str):
    """A symmetric GPTQ weight -> (GGUF type, rows uint8 (N, row bytes)): Q4_0 / Q8_0 blocks holding its numbers."""
    from gguf import GGMLQuantizationType as Q
    N, K, G = gptq_shapes(qweight.shape, scheme, what)
    group = K // G
    if scales.shape != (G, N) or qzeros.shape != (G, N * scheme.bits // 32):
        raise ModelLoadError(f"{what}: scales {scales.shape} / qzeros {qzeros.shape} do not fit {G} groups of {N}")
    if g_idx is not None and not np.array_equal(np.asarray(g_idx), np.arange(K) // group):
        raise ModelLoadError(f"{what}: act-order (a g_idx that is not k // group_size) is not supported yet")
    zeros = _unpack(qzeros, scheme.bits, 1).astype(np.int32) + (0 if scheme.v2 else 1)
    mid = 1 << (scheme.bits - 1)
    if not (zeros == mid).all():
        raise ModelLoadError(f"{what}: zero points other than {mid} (an asymmetric checkpoint) are not supported yet")
    q = _unpack(qweight, scheme.bits, 0).T  # (N, K) unsigned values
    d = np.repeat(np.asarray(scales, np.float16).T, group // 32, axis=1)  # (N, K / 32): a scale per 32-block
    nb = K // 32
    if scheme.bits == 4:  # Q4_0: d, then element j in the low nibble of byte j, element j + 16 in the high one
        blocks = q.reshape(N, nb, 32)
        out = np.empty((N, nb, 18), np.uint8)
        out[..., 2:] = blocks[..., :16] | (blocks[..., 16:] << 4)
        qtype = Q.Q4_0
    else:  # Q8_0: d, then q - 128 as int8
        out = np.empty((N, nb, 34), np.uint8)
        out[..., 2:] = (q.reshape(N, nb, 32).astype(np.int16) - 128).astype(np.int8).view(np.uint8)
        qtype = Q.Q8_0
    out[..., :2] = d.view(np.uint8).reshape(N, nb, 2)
    return qtype, out.reshape(N, -1)
