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
checkpoint format, as they are in "gptq_v2"), `<name>.g_idx` int32 (K,); value = scale * (q - zero).
AWQ (quant_method "awq", AutoAWQ's "gemm" version): `<name>.qweight` int32 (K, N / 8) packing 4-bit values along the
outputs in the order 0, 2, 4, 6, 1, 3, 5, 7, `<name>.qzeros` (K / g, N / 8) likewise, `<name>.scales` float16 (K / g,
N); value = scale * (q - zero).
Both become GGUF blocks holding the same numbers, exactly, run by those formats' kernels: symmetric 4-bit (every
zero 8) as Q4_0 (fp16 d = the group's scale, q - 8: 4.5 bits a weight against the file's ~4.1), asymmetric 4-bit as
Q5_0 (q - zero in -15..15 fits its 5-bit range: 5.5 bits), symmetric 8-bit as Q8_0. Groups must be whole 32-value
blocks (32, 64, 128, ..., or -1: one group per row).
compressed-tensors "pack-quantized" (llm-compressor's W4A16 / W8A16: `weight_packed` int32 (N, K / per) holding
value + 2^(bits - 1) packed along the input dim, `weight_scale` (N, groups), `weight_zero_point` packed along the
outputs when asymmetric) and "int-quantized" (W8A8: int8 `weight`, per-row `weight_scale`) go the same way (their
dynamic per-token int8 activations are what Q8_0's kernels do per 32 values).
Not yet: asymmetric 8-bit, act-order with a g_idx that is not k // group_size, 2/3-bit, AWQ's gemv/marlin layouts.
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
SUPPORTED = ("fp8 (e4m3, block-wise or per-tensor), compressed-tensors float-quantized (FP8 W8A8/W8A16), "
             "pack-quantized (W4A16, W8A16) and int-quantized (W8A8), gptq (4-bit, 8-bit symmetric), awq (4-bit gemm)")
GPTQ_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")
CT_INT_SUFFIXES = ("weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx", "input_scale")


@dataclass(frozen=True)
class GPTQScheme:
    """A GPTQ or AWQ checkpoint: bits (4 or 8), group (values per scale along K; -1: the whole row), sym (every zero
    point at 2^(bits - 1)), v2 (zero points stored as they are; the "gptq" format stores them minus one)."""
    bits: int
    group: int
    sym: bool
    v2: bool
    method: str = "gptq"

    @property
    def ggml_type(self):
        from gguf import GGMLQuantizationType as Q
        return Q.Q8_0 if self.bits == 8 else Q.Q4_0 if self.sym else Q.Q5_0


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


def _compressed_tensors(qc: dict, source: str) -> FP8Scheme | GPTQScheme:
    fmt = qc.get("format")
    groups = qc.get("config_groups")
    if fmt not in ("float-quantized", "pack-quantized", "int-quantized"):
        _fail(source, f"compressed-tensors format {fmt!r} is not supported yet (supported: {SUPPORTED})")
    if not isinstance(groups, dict) or not groups:
        _fail(source, "compressed-tensors without config_groups")
    if fmt != "float-quantized":
        return _compressed_int(fmt, groups, source)
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


def _compressed_int(fmt: str, groups: dict, source: str) -> GPTQScheme:
    """pack-quantized (W4A16 / W8A16: int values packed 32 / bits to an int32 along the input dim, plus 2^(bits-1))
    and int-quantized (W8A8: int8 weights) groups -> one GPTQScheme (all groups must agree)."""
    schemes = set()
    for name, g in groups.items():
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict) or w.get("type") != "int":
            _fail(source, f"config_groups.{name}: {fmt} needs int weights")
        bits, strategy, sym = w.get("num_bits"), w.get("strategy"), w.get("symmetric", True) is True
        if bits not in ((4, 8) if fmt == "pack-quantized" else (8,)):
            _fail(source, f"config_groups.{name}: {bits}-bit {fmt} weights are not supported")
        if strategy not in ("group", "channel"):
            _fail(source, f"config_groups.{name}: weight strategy {strategy!r} is not supported (group, channel)")
        if bits == 8 and not sym:
            _fail(source, f"config_groups.{name}: asymmetric 8-bit weights are not supported yet")
        if w.get("actorder") not in (None, False, "static") and strategy == "group":
            _fail(source, f"config_groups.{name}: actorder {w.get('actorder')!r} is not supported yet")
        group = -1 if strategy == "channel" else _group({"group_size": w.get("group_size")}, source, fmt)
        schemes.add(GPTQScheme(bits, group, sym, True, "ct-" + fmt.split("-")[0]))
    if len(schemes) != 1:
        _fail(source, f"config_groups quantize differently {sorted(schemes, key=str)}: not supported yet")
    return schemes.pop()


def _group(qc: dict, source: str, method: str) -> int:
    group = qc.get("group_size", qc.get("q_group_size", 128))
    if not isinstance(group, int) or isinstance(group, bool) or not (group == -1 or (group > 0 and group % 32 == 0)):
        _fail(source, f"{method} group_size {group!r} is not supported (a multiple of 32, or -1)")
    return group


def _gptq(qc: dict, source: str) -> GPTQScheme:
    bits = qc.get("bits")
    if bits not in (4, 8):
        _fail(source, f"gptq bits {bits!r} are not supported (4, 8)")
    group, sym = _group(qc, source, "gptq"), qc.get("sym", True)
    if bits == 8 and sym is not True:
        _fail(source, "asymmetric 8-bit GPTQ (sym: false) is not supported yet")
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        _fail(source, f"gptq checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
    return GPTQScheme(bits, group, sym is True, fmt == "gptq_v2")


def _awq(qc: dict, source: str) -> GPTQScheme:
    bits, version = qc.get("bits", qc.get("w_bit")), str(qc.get("version", "gemm")).lower()
    if bits != 4:
        _fail(source, f"awq bits {bits!r} are not supported (4)")
    if version != "gemm":
        _fail(source, f"awq version {version!r} is not supported yet (gemm)")
    if qc.get("zero_point", True) is not True:
        _fail(source, "awq without zero points is not supported yet")
    return GPTQScheme(4, _group(qc, source, "awq"), False, True, "awq")


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
    if method == "awq":
        return _awq(qc, source)
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


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's gemm packing: nibble i of a word holds column 8 c + AWQ_ORDER[i]


def _unpack(words: np.ndarray, bits: int, axis: int, order=None) -> np.ndarray:
    """int32 words packing 32 / bits values each (value j at bits j * bits, or at AWQ_ORDER's place) -> uint8 values,
    unpacked along axis."""
    per = 32 // bits
    w = np.asarray(words).view(np.uint32)
    vals = np.stack([(w >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], axis=axis + 1)
    if order is not None:  # slot i holds value order[i]: put each value back at its own index
        vals = np.take(vals, np.argsort(order), axis=axis + 1)
    shape = list(w.shape)
    shape[axis] *= per
    return vals.reshape(shape).astype(np.uint8)


def gptq_shapes(qweight_shape: tuple, scheme: GPTQScheme, what: str) -> tuple[int, int, int]:
    """(N, K, groups) of a GPTQ / AWQ weight from its qweight's shape; ModelLoadError if they do not fit the scheme."""
    if len(qweight_shape) != 2:
        raise ModelLoadError(f"{what}: qweight of shape {qweight_shape} is not 2-D")
    if scheme.method == "awq":
        K, N = qweight_shape[0], qweight_shape[1] * 32 // scheme.bits
    else:
        K, N = qweight_shape[0] * 32 // scheme.bits, qweight_shape[1]
    group = K if scheme.group == -1 else scheme.group
    if K % group or K % 32:
        raise ModelLoadError(f"{what}: {K} input values do not split into groups of {group} (and 32-value blocks)")
    return N, K, K // group


def _q5_0_blocks(v: np.ndarray) -> np.ndarray:
    """values -16..15 (N, nb, 32) -> Q5_0 bytes after d: qh (bit j: the high bit of q + 16) then the low nibbles."""
    u = (v + 16).astype(np.uint8)
    qh = ((u >> 4).astype(np.uint32) << np.arange(32, dtype=np.uint32)).sum(axis=-1, dtype=np.uint32)
    lo = u & 15
    return np.concatenate([qh[..., None].view(np.uint8).reshape(*qh.shape, 4), lo[..., :16] | (lo[..., 16:] << 4)],
                          axis=-1)


def gptq_rows(qweight, qzeros, scales, g_idx, scheme: GPTQScheme, what: str) -> np.ndarray:
    """A GPTQ / AWQ weight -> rows uint8 (N, row bytes) of scheme.ggml_type (Q4_0, Q5_0 or Q8_0) holding its
    numbers: d = the group's scale, q - zero."""
    N, K, G = gptq_shapes(qweight.shape, scheme, what)
    group = K // G
    per = 32 // scheme.bits
    awq = scheme.method == "awq"
    if scales.shape != (G, N) or qzeros.shape != (G, N // per):
        raise ModelLoadError(f"{what}: scales {scales.shape} / qzeros {qzeros.shape} do not fit {G} groups of {N}")
    if g_idx is not None and not np.array_equal(np.asarray(g_idx), np.arange(K) // group):
        raise ModelLoadError(f"{what}: act-order (a g_idx that is not k // group_size) is not supported yet")
    order = AWQ_ORDER if awq else None
    zeros = _unpack(qzeros, scheme.bits, 1, order).astype(np.int32) + (0 if scheme.v2 else 1)  # (G, N)
    mid = 1 << (scheme.bits - 1)
    if scheme.sym and not (zeros == mid).all():
        raise ModelLoadError(f"{what}: zero points other than {mid} in a symmetric checkpoint")
    q = (_unpack(qweight, scheme.bits, 1, order) if awq else _unpack(qweight, scheme.bits, 0)).T  # (N, K)
    v = (q.astype(np.int32) - np.repeat(zeros.T, group, axis=1)).reshape(N, K // 32, 32)  # q - zero
    d = np.repeat(np.asarray(scales, np.float16).T, group // 32, axis=1)  # (N, K / 32): a scale per 32-block
    return int_blocks(v, d, scheme.ggml_type, what)


def int_blocks(v: np.ndarray, d: np.ndarray, t, what: str) -> np.ndarray:
    """Integer values v (N, nb, 32) times fp16 scales d (N, nb) -> rows uint8 (N, nb * type size) of GGUF type t
    (Q4_0: -8..7, Q5_0: -16..15, Q8_0: -128..127) holding exactly those numbers."""
    from gguf import GGMLQuantizationType as Q
    N, nb = d.shape
    lo, hi = {Q.Q4_0: (-8, 7), Q.Q5_0: (-16, 15), Q.Q8_0: (-128, 127)}[t]
    if v.min() < lo or v.max() > hi:
        raise ModelLoadError(f"{what}: values outside {t.name}'s {lo}..{hi} (zero points out of range)")
    if t == Q.Q4_0:  # d, then v + 8 of element j in the low nibble of byte j, element j + 16's in the high one
        u = (v + 8).astype(np.uint8)
        body = u[..., :16] | (u[..., 16:] << 4)
    elif t == Q.Q5_0:
        body = _q5_0_blocks(v)
    else:
        body = v.astype(np.int8).view(np.uint8)
    out = np.concatenate([np.ascontiguousarray(d, np.float16).view(np.uint8).reshape(N, nb, 2), body], axis=-1)
    return out.reshape(N, -1)


def ct_rows(weight, scale, zero_point, g_idx, scheme: GPTQScheme, what: str) -> np.ndarray:
    """A compressed-tensors int weight (weight_packed int32 (N, K / per), or int8 (N, K) for int-quantized), its
    weight_scale (N, groups) and weight_zero_point (packed along the outputs, (N / per, groups)) -> GGUF rows."""
    bits = scheme.bits
    off = 1 << (bits - 1)
    if scheme.method == "ct-pack":
        q = _unpack(weight, bits, 1).astype(np.int32) - off  # stored plus 2^(bits - 1)
    else:
        q = np.asarray(weight, np.int8).astype(np.int32)
    N, K = q.shape
    s = np.asarray(scale, np.float32)
    if s.ndim != 2 or s.shape[0] != N or K % s.shape[1] or (K // s.shape[1]) % 32:
        raise ModelLoadError(f"{what}: weight_scale {s.shape} does not fit ({N}, {K}) in 32-value blocks")
    group = K // s.shape[1]
    if scheme.group not in (-1, group):
        raise ModelLoadError(f"{what}: weight_scale {s.shape} does not make groups of {scheme.group}")
    if g_idx is not None and not np.array_equal(np.asarray(g_idx), np.arange(K) // group):
        raise ModelLoadError(f"{what}: act-order (a weight_g_idx that is not k // group_size) is not supported yet")
    if scheme.sym:
        zp = np.zeros_like(s, dtype=np.int32)
    else:
        if zero_point is None:
            raise ModelLoadError(f"{what}: missing weight_zero_point")
        zp = _unpack(zero_point, bits, 0).astype(np.int32)[:N] - off
    v = (q - np.repeat(zp, group, axis=1)).reshape(N, K // 32, 32)
    d = np.repeat(s.astype(np.float16), group // 32, axis=1)  # bf16 / fp16 scales exactly; float32 ones to 2^-11
    return int_blocks(v, d, scheme.ggml_type, what)
