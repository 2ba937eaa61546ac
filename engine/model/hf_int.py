"""Integer-quantized HF checkpoints' weights (hf_quant.IntScheme) as the GGUF blocks that hold the same numbers.

GPTQ (quant_method "gptq", AutoGPTQ/GPTQModel's layout): `<name>.qweight` int32 (K / 32 * bits, N) packing `bits`-bit
values along the input dim (value of input row 32 i / bits + j at bits j * bits), `<name>.scales` float16 (K / g, N),
`<name>.qzeros` int32 (K / g, N / 32 * bits) packing zero points along the outputs (stored minus one in the "gptq"
checkpoint format, as they are in "gptq_v2"), `<name>.g_idx` int32 (K,); value = scale * (q - zero).
AWQ (quant_method "awq", AutoAWQ's "gemm" version): `<name>.qweight` int32 (K, N / 8) packing 4-bit values along the
outputs in the order 0, 2, 4, 6, 1, 3, 5, 7, `<name>.qzeros` (K / g, N / 8) likewise, `<name>.scales` float16 (K / g,
N); value = scale * (q - zero).
Both become GGUF blocks holding the same numbers, exactly, run by those formats' kernels: symmetric 4-bit (every
zero 8) as Q4_0 (fp16 d = the group's scale, q - 8: 4.5 bits a weight against the file's ~4.1), asymmetric 4-bit as
Q5_0 (q - zero in -15..15 fits its 5-bit range: 5.5 bits), symmetric 8-bit as ramlm's Q8_A16 (Q8_0's blocks),
asymmetric 8-bit (q - zero in -255..255) as ramlm's U8_ZP (Q8_0's bytes with a zero point per block: 8.75 bits); both
8-bit types run with activations kept to 16-bit precision, as these weight-only (W8A16) checkpoints are meant to run.
Groups must be whole 32-value blocks (32, 64, 128, ..., or -1: one group per row).
compressed-tensors "pack-quantized" (llm-compressor's W4A16 / W8A16: `weight_packed` int32 (N, K / per) holding
value + 2^(bits - 1) packed along the input dim, `weight_scale` (N, groups), `weight_zero_point` packed along the
outputs when asymmetric) and "int-quantized" (W8A8: int8 `weight`, per-row `weight_scale`, as Q8_0) go the same way
(W8A8's dynamic per-token int8 activations are what Q8_0's kernels do per 32 values).
Act-order (desc_act: a g_idx that is not k // group_size) holds each group's inputs scattered along K: the rows are
built over the inputs sorted by group (act_order's permutation), where the groups are whole blocks again, and the
model gathers its activations in that order before the matmul (WeightSource.in_perm, parts/linear.py); stacked MoE
experts keep one order per expert ((E, K), parts/moe.py).
Not yet: 2/3-bit, AWQ's gemv/marlin layouts, asymmetric int-quantized (W8A8) weights.
"""
from __future__ import annotations

import numpy as np

from cpu_kernels.quant.qtypes import U8_ZP_BYTES, RamlmType
from engine.errors import ModelLoadError
from engine.model.hf_quant import IntScheme


def entry(weights, src, gguf_name: str):
    """(GGUF type, (N, K), load) for the packed weight src (qweight, weight_packed or an int8 weight) of HFWeights
    `weights`; its scales and zero points are found beside it."""
    f, key = src
    scheme = weights.quant
    what = f"{f.path}: tensor '{key}' ({gguf_name})"
    stem, kind = key.rsplit(".", 1)
    stem += "."
    ct = scheme.method.startswith("ct-")
    if ct:
        rows, packed = f.entries[key][1]
        N, K = (rows, packed * 32 // scheme.bits) if kind == "weight_packed" else (rows, packed)
        needed = ("weight_scale",) + (() if scheme.sym else ("weight_zero_point",))
    else:
        N, K, _ = gptq_shapes(f.entries[key][1], scheme, what)
        needed = ("qzeros", "scales")
    for aux in needed:
        if stem + aux not in weights.file_of:
            raise ModelLoadError(f"{what}: missing tensor '{stem}{aux}'")

    def part(aux):
        if stem + aux not in weights.file_of:
            return None
        return weights.float_array((weights.file_of[stem + aux], stem + aux))

    def load():
        if ct:
            return ct_rows(part(kind), part("weight_scale"), part("weight_zero_point"), part("weight_g_idx"), scheme,
                           what)
        return gptq_rows(part("qweight"), part("qzeros"), part("scales"), part("g_idx"), scheme, what)
    return scheme.ggml_type, (N, K), load


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


def gptq_shapes(qweight_shape: tuple, scheme: IntScheme, what: str) -> tuple[int, int, int]:
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


def act_order(g_idx, K: int, group: int, what: str) -> np.ndarray | None:
    """None for a g_idx of k // group_size (or none); else the input permutation (int64 (K,)) that sorts the inputs
    by group: act-order checkpoints give each group group_size inputs, which then sit side by side."""
    if g_idx is None:
        return None
    g = np.asarray(g_idx).astype(np.int64).reshape(-1)
    contiguous = np.arange(K) // group
    if g.shape != (K,):
        raise ModelLoadError(f"{what}: g_idx has {g.size} entries for {K} inputs")
    if np.array_equal(g, contiguous):
        return None
    perm = np.argsort(g, kind="stable")
    if not np.array_equal(g[perm], contiguous):
        raise ModelLoadError(f"{what}: g_idx does not give each group {group} inputs (act-order needs whole groups)")
    return perm


def input_perm(weights, src) -> np.ndarray | None:
    """act_order's permutation of the packed weight src of HFWeights `weights` (None without act-order)."""
    f, key = src
    scheme = weights.quant
    ct = scheme.method.startswith("ct-")
    aux = key.rsplit(".", 1)[0] + (".weight_g_idx" if ct else ".g_idx")
    if aux not in weights.file_of:
        return None
    g = weights.float_array((weights.file_of[aux], aux))
    K = g.size
    return act_order(g, K, K if scheme.group == -1 else scheme.group, f"{f.path}: tensor '{key}'")


def gptq_rows(qweight, qzeros, scales, g_idx, scheme: IntScheme, what: str) -> np.ndarray:
    """A GPTQ / AWQ weight -> rows uint8 (N, row bytes) of scheme.ggml_type (Q4_0, Q5_0 or Q8_0) holding its
    numbers: d = the group's scale, q - zero."""
    N, K, G = gptq_shapes(qweight.shape, scheme, what)
    group = K // G
    per = 32 // scheme.bits
    awq = scheme.method == "awq"
    if scales.shape != (G, N) or qzeros.shape != (G, N // per):
        raise ModelLoadError(f"{what}: scales {scales.shape} / qzeros {qzeros.shape} do not fit {G} groups of {N}")
    perm = act_order(g_idx, K, group, what)
    order = AWQ_ORDER if awq else None
    zeros = _unpack(qzeros, scheme.bits, 1, order).astype(np.int32) + (0 if scheme.v2 else 1)  # (G, N)
    mid = 1 << (scheme.bits - 1)
    if scheme.sym and not (zeros == mid).all():
        raise ModelLoadError(f"{what}: zero points other than {mid} in a symmetric checkpoint")
    q = (_unpack(qweight, scheme.bits, 1, order) if awq else _unpack(qweight, scheme.bits, 0)).T  # (N, K)
    if perm is not None:  # the inputs sorted by group: the groups become whole blocks
        q = q[:, perm]
    v = (q.astype(np.int32) - np.repeat(zeros.T, group, axis=1)).reshape(N, K // 32, 32)  # q - zero
    d = np.repeat(np.asarray(scales, np.float16).T, group // 32, axis=1)  # (N, K / 32): a scale per 32-block
    return int_blocks(v, d, scheme.ggml_type, what)


def int_blocks(v: np.ndarray, d: np.ndarray, t, what: str) -> np.ndarray:
    """Integer values v (N, nb, 32) times fp16 scales d (N, nb) -> rows uint8 (N, nb * type size) of type t
    (Q4_0: -8..7, Q5_0: -16..15, Q8_0: -128..127, U8_ZP: any 255-wide span per block) holding exactly those numbers."""
    from gguf import GGMLQuantizationType as Q
    N, nb = d.shape
    if t == RamlmType.U8_ZP:
        return _u8_zp_blocks(v, d, what)
    lo, hi = {Q.Q4_0: (-8, 7), Q.Q5_0: (-16, 15), Q.Q8_0: (-128, 127), RamlmType.Q8_A16: (-128, 127)}[t]
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


def _u8_zp_blocks(v: np.ndarray, d: np.ndarray, what: str) -> np.ndarray:
    """Values v (N, nb, 32) spanning at most 255 per block, fp16 scales d (N, nb) -> U8_ZP rows: each block's zero point
    z puts v + z in 0..255 (128 where it can: the block's zero-point share in the GEMV is then 0)."""
    vmin, vmax = v.min(axis=-1), v.max(axis=-1)
    if (vmax - vmin > 255).any():
        raise ModelLoadError(f"{what}: values span more than 8 bits in a block (zero points out of range)")
    z = np.clip(128, -vmin, 255 - vmax)
    out = np.empty(v.shape[:2] + (U8_ZP_BYTES,), np.uint8)
    out[..., :2] = np.ascontiguousarray(d, np.float16).view(np.uint8).reshape(*d.shape, 2)
    out[..., 2] = z
    out[..., 3:] = v + z[..., None]
    return out.reshape(v.shape[0], -1)


def ct_rows(weight, scale, zero_point, g_idx, scheme: IntScheme, what: str) -> np.ndarray:
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
    perm = act_order(g_idx, K, group, what)
    if perm is not None:
        q = q[:, perm]
    if scheme.sym:
        zp = np.zeros_like(s, dtype=np.int32)
    else:
        if zero_point is None:
            raise ModelLoadError(f"{what}: missing weight_zero_point")
        zp = _unpack(zero_point, bits, 0).astype(np.int32)[:N] - off
    v = (q - np.repeat(zp, group, axis=1)).reshape(N, K // 32, 32)
    d = np.repeat(s.astype(np.float16), group // 32, axis=1)  # bf16 / fp16 scales exactly; float32 ones to 2^-11
    return int_blocks(v, d, scheme.ggml_type, what)
