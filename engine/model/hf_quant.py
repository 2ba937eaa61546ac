"""Quantized HF checkpoints: config.json's quantization_config read into a scheme (FP8Scheme, IntScheme), or a
ModelLoadError naming what is malformed or not supported. How each scheme's tensors become ramlm's weights:
hf_fp8.py (FP8: float8 e4m3 weights and their scales) and hf_int.py (GPTQ, AWQ, compressed-tensors int formats).
Layers left unquantized (`ignore`, `modules_to_not_convert`) are plain F32/F16/BF16 tensors and load as such.
"""
from __future__ import annotations

from dataclasses import dataclass

from cpu_kernels.quant.qtypes import FP8_BLOCK
from engine.errors import ModelLoadError

# Tensors that ride along with a quantized weight: read with it, never mapped on their own.
SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale")
AUX_SUFFIXES = SCALE_SUFFIXES + ("input_scale",)
SUPPORTED = ("fp8 (e4m3, block-wise or per-tensor), compressed-tensors float-quantized (FP8 W8A8/W8A16), "
             "pack-quantized (W4A16, W8A16) and int-quantized (W8A8), gptq (4-bit, 8-bit), awq (4-bit gemm)")
GPTQ_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")
CT_INT_SUFFIXES = ("weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx", "input_scale")


@dataclass(frozen=True)
class IntScheme:
    """A GPTQ, AWQ or compressed-tensors int checkpoint (method gptq, awq, ct-pack, ct-int): bits (4 or 8), group (values per scale along K; -1: the whole row), sym (every zero
    point at 2^(bits - 1)), v2 (zero points stored as they are; the "gptq" format stores them minus one)."""
    bits: int
    group: int
    sym: bool
    v2: bool
    method: str = "gptq"

    @property
    def ggml_type(self):
        from gguf import GGMLQuantizationType as Q
        from cpu_kernels.quant.qtypes import RamlmType
        if self.bits == 8:  # int-quantized is W8A8 (int8 activations, as vLLM's); the others are weight-only (W8A16)
            return (Q.Q8_0 if self.method == "ct-int" else RamlmType.Q8_A16) if self.sym else RamlmType.U8_ZP
        return Q.Q4_0 if self.sym else Q.Q5_0


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


def _compressed_tensors(qc: dict, source: str) -> FP8Scheme | IntScheme:
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


def _compressed_int(fmt: str, groups: dict, source: str) -> IntScheme:
    """pack-quantized (W4A16 / W8A16: int values packed 32 / bits to an int32 along the input dim, plus 2^(bits-1))
    and int-quantized (W8A8: int8 weights) groups -> one IntScheme (all groups must agree)."""
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
        if fmt == "int-quantized" and not sym:  # as vLLM's W8A8 int kernels: zero points on activations only
            _fail(source, f"config_groups.{name}: asymmetric int-quantized (W8A8) weights are not supported")
        if w.get("actorder") not in (None, False, "static", "weight", "group"):  # "group": weight_g_idx (hf_int)
            _fail(source, f"config_groups.{name}: actorder {w.get('actorder')!r} is not supported")
        group = -1 if strategy == "channel" else _group({"group_size": w.get("group_size")}, source, fmt)
        schemes.add(IntScheme(bits, group, sym, True, "ct-" + fmt.split("-")[0]))
    if len(schemes) != 1:
        _fail(source, f"config_groups quantize differently {sorted(schemes, key=str)}: not supported yet")
    return schemes.pop()


def _group(qc: dict, source: str, method: str) -> int:
    group = qc.get("group_size", qc.get("q_group_size", 128))
    if not isinstance(group, int) or isinstance(group, bool) or not (group == -1 or (group > 0 and group % 32 == 0)):
        _fail(source, f"{method} group_size {group!r} is not supported (a multiple of 32, or -1)")
    return group


def _gptq(qc: dict, source: str) -> IntScheme:
    bits = qc.get("bits")
    if bits not in (4, 8):
        _fail(source, f"gptq bits {bits!r} are not supported (4, 8)")
    group, sym = _group(qc, source, "gptq"), qc.get("sym", True)
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        _fail(source, f"gptq checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
    return IntScheme(bits, group, sym is True, fmt == "gptq_v2")


def _awq(qc: dict, source: str) -> IntScheme:
    bits, version = qc.get("bits", qc.get("w_bit")), str(qc.get("version", "gemm")).lower()
    if bits != 4:
        _fail(source, f"awq bits {bits!r} are not supported (4)")
    if version != "gemm":
        _fail(source, f"awq version {version!r} is not supported yet (gemm)")
    if qc.get("zero_point", True) is not True:
        _fail(source, "awq without zero points is not supported yet")
    return IntScheme(4, _group(qc, source, "awq"), False, True, "awq")


def parse(config_json: dict, source: str = "config.json") -> FP8Scheme | IntScheme | None:
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
