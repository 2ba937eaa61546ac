"""quantize(ggml_type, w f32 (N, K)) -> raw uint8 (N, bytes_per_row), as a GGUF file stores it.

The legacy formats, MXFP4 and BF16 use gguf's own quantizers (bit-exact with llama.cpp's reference); the
K-quants and the IQ4 formats, which gguf cannot quantize, get simple min-max / absmax quantizers per sub-block
(no llama.cpp-style search, so somewhat larger errors): good enough for tests and synthetic models. U8_ZP takes each
block's min and max; FP8_E4M3 scales
each 128 values of a row to e4m3's range; it, Q8_0 and Q4_K run quantize_fast.py's parallel twins.
"""
from __future__ import annotations

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

from .qtypes import QUANT_SIZES, RamlmType, qtype
from .quantize_fast import fp8_rows, q4_k_rows, q8_0_rows

QKK = 256


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    """float (..., ) -> uint8 (..., 2) little-endian fp16."""
    return np.ascontiguousarray(v.astype(np.float16)).view(np.uint8).reshape(*v.shape, 2)


def _f16_round(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).astype(np.float32)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0).astype(np.float32)


def _pack_2bit_groups(u: np.ndarray) -> np.ndarray:
    """u (n, 256) values 0..3 -> (n, 64): group j of 32 goes to bits 2(j%4) of bytes 32(j//4)..+32."""
    g = u.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (g[:, :, 0] | (g[:, :, 1] << 2) | (g[:, :, 2] << 4) | (g[:, :, 3] << 6)).reshape(-1, 64)


def _pack_bits(u: np.ndarray) -> np.ndarray:
    """bits (n, 256) -> (n, 32): bit j of byte l = bit of element 32 j + l."""
    g = u.reshape(-1, 8, 32).astype(np.uint8)
    return np.bitwise_or.reduce(g << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)


def _q2_k(x: np.ndarray) -> np.ndarray:
    xs = x.reshape(-1, 16, 16)
    mn = np.maximum(0, -xs.min(-1))
    scale = (xs.max(-1) + mn) / 3
    d = _f16_round(scale.max(-1) / 15)
    dmin = _f16_round(mn.max(-1) / 15)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), 0, 15)
    m = np.clip(np.rint(_safe_div(mn, dmin[:, None])), 0, 15)
    dl, ml = d[:, None] * sc, dmin[:, None] * m
    q = np.clip(np.rint(_safe_div(xs + ml[..., None], dl[..., None])), 0, 3)
    scales = (sc.astype(np.uint8) | (m.astype(np.uint8) << 4))
    return np.concatenate([scales, _pack_2bit_groups(q), _f16_bytes(d), _f16_bytes(dmin)], axis=-1)


def _q3_k(x: np.ndarray) -> np.ndarray:
    xs = x.reshape(-1, 16, 16)
    scale = np.abs(xs).max(-1) / 4
    d = _f16_round(scale.max(-1) / 31)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), 0, 31)
    q = np.clip(np.rint(_safe_div(xs, (d[:, None] * sc)[..., None])), -4, 3)
    u = (q + 4).astype(np.uint8).reshape(-1, QKK)
    s6 = (sc + 32).astype(np.uint8)
    lo = (s6[:, 0:8] & 15) | ((s6[:, 8:16] & 15) << 4)
    hi = np.zeros((s6.shape[0], 4), np.uint8)
    for k in range(4):
        hi |= ((s6[:, 4 * k:4 * k + 4] >> 4) & 3) << (2 * k)
    return np.concatenate([_pack_bits(u >> 2), _pack_2bit_groups(u & 3), lo, hi, _f16_bytes(d)], axis=-1)


def _scale_min_k4_pack(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    b0 = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    b1 = (mn[:, 0:4] & 0x3F) | ((mn[:, 4:8] >> 4) << 6)
    b2 = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return np.concatenate([b0, b1, b2], axis=-1)


def _q45_k(x: np.ndarray, levels: int):
    xs = x.reshape(-1, 8, 32)
    mn = np.maximum(0, -xs.min(-1))
    scale = (xs.max(-1) + mn) / levels
    d = _f16_round(scale.max(-1) / 63)
    dmin = _f16_round(mn.max(-1) / 63)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), 0, 63)
    m = np.clip(np.rint(_safe_div(mn, dmin[:, None])), 0, 63)
    dl, ml = d[:, None] * sc, dmin[:, None] * m
    q = np.clip(np.rint(_safe_div(xs + ml[..., None], dl[..., None])), 0, levels).astype(np.uint8)
    head = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _scale_min_k4_pack(sc, m)], axis=-1)
    q = q.reshape(-1, 4, 2, 32)
    qs = ((q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)).reshape(-1, 128)
    return head, qs, q.reshape(-1, QKK)


def _q4_k(x):
    head, qs, _ = _q45_k(x, 15)
    return np.concatenate([head, qs], axis=-1)


def _q5_k(x):
    head, qs, q = _q45_k(x, 31)
    return np.concatenate([head, _pack_bits(q >> 4), qs], axis=-1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    xs = x.reshape(-1, 16, 16)
    scale = np.abs(xs).max(-1) / 31
    d = _f16_round(scale.max(-1) / 127)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), 0, 127)
    q = np.clip(np.rint(_safe_div(xs, (d[:, None] * sc)[..., None])), -32, 31)
    u = (q + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # (block, half, group, l)
    ql = np.concatenate([(u[:, :, 0] & 15) | ((u[:, :, 2] & 15) << 4),
                         (u[:, :, 1] & 15) | ((u[:, :, 3] & 15) << 4)], axis=-1).reshape(-1, 128)
    qh = ((u[:, :, 0] >> 4) | ((u[:, :, 1] >> 4) << 2) | ((u[:, :, 2] >> 4) << 4)
          | ((u[:, :, 3] >> 4) << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=-1)


IQ4_LEVELS = np.array((-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113), np.float32)


def _iq4_codes(xs: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The nearest level's code of every value of xs (..., 32) at the block scales (...,)."""
    mids = (IQ4_LEVELS[1:] + IQ4_LEVELS[:-1]) / 2
    return np.searchsorted(mids, _safe_div(xs, scale[..., None])).astype(np.uint8)


def _iq4_block_scales(xs: np.ndarray) -> np.ndarray:
    """Per 32 values (..., 32): the largest-magnitude value mapped onto level -127 (llama.cpp's starting scale),
    then refit by least squares to the codes it gives."""
    big = np.take_along_axis(xs, np.abs(xs).argmax(-1)[..., None], -1)[..., 0]
    scale = big / -127
    lv = IQ4_LEVELS[_iq4_codes(xs, scale)]
    return np.where(scale != 0, _safe_div((xs * lv).sum(-1), (lv * lv).sum(-1)), 0).astype(np.float32)


def _iq4_pack(codes: np.ndarray) -> np.ndarray:
    """codes (..., 32) -> (..., 16): element j in the low nibble of byte j, element j + 16 in the high nibble."""
    return codes[..., :16] | (codes[..., 16:] << 4)


def _iq4_nl(x: np.ndarray) -> np.ndarray:
    xs = x.reshape(-1, 32)
    d = _f16_round(_iq4_block_scales(xs))
    return np.concatenate([_f16_bytes(d), _iq4_pack(_iq4_codes(xs, d))], axis=-1)


def _iq4_xs(x: np.ndarray) -> np.ndarray:
    xs = x.reshape(-1, 8, 32)
    scale = _iq4_block_scales(xs)
    big = np.take_along_axis(scale, np.abs(scale).argmax(-1)[:, None], -1)[:, 0]
    d = _f16_round(big / -32)  # the largest sub-scale at ls - 32 = -32, as llama.cpp starts
    ls = np.clip(np.rint(_safe_div(scale, d[:, None])), -32, 31).astype(np.int32) + 32
    codes = _iq4_codes(xs, d[:, None] * (ls - 32).astype(np.float32))
    lsu = ls.astype(np.uint8)
    scales_l = (lsu[:, 0::2] & 15) | ((lsu[:, 1::2] & 15) << 4)
    scales_h = ((lsu.astype(np.uint16) >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(-1, dtype=np.uint16)
    return np.concatenate([_f16_bytes(d), scales_h[:, None].view(np.uint8), scales_l,
                           _iq4_pack(codes).reshape(-1, 128)], axis=-1)


def _u8_zp(w: np.ndarray) -> np.ndarray:
    """RamlmType.U8_ZP blocks (n, 35) of w's 32-value blocks: min-max per block, as an asymmetric 8-bit
    checkpoint's groups are made (over 32 values here)."""
    lo, hi = np.minimum(w.min(-1), 0), np.maximum(w.max(-1), 0)
    d = _f16_round(np.where(hi > lo, (hi - lo) / 255, 1).astype(np.float32))
    z = np.clip(np.rint(-lo / d), 0, 255)
    q = np.clip(np.rint(w / d[:, None]) + z[:, None], 0, 255)
    return np.concatenate([_f16_bytes(d), z[:, None].astype(np.uint8), q.astype(np.uint8)], axis=-1)


# Q4_K takes quantize_fast.q4_k_rows (bit-equal to _q4_k, kept as its reference)
_K_QUANTIZERS = {Q.Q2_K: _q2_k, Q.Q3_K: _q3_k, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k, Q.IQ4_XS: _iq4_xs}
_GGUF_QUANTIZERS = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16, Q.MXFP4, Q.TQ1_0, Q.TQ2_0)
# Formats ramlm runs but does not write: the grid i-quants need llama.cpp's lattice search (with an importance
# matrix), and gguf has no NVFP4 quantizer to be bit-exact with.
UNWRITTEN = (Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.NVFP4)


def quantize(ggml_type, w: np.ndarray) -> np.ndarray:
    """w f32 (N, K) -> raw uint8 (N, bytes_per_row). K must be a multiple of the block size."""
    t = qtype(ggml_type)
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize expects a 2-D (N, K) array, got shape {w.shape}")
    N, K = w.shape
    block, type_size = QUANT_SIZES[t]
    if K % block:
        raise ValueError(f"{t.name}: row length {K} is not a multiple of the block size {block}")
    if t == Q.F32:
        return w.view(np.uint8).reshape(N, 4 * K).copy()
    if t == RamlmType.FP8_E4M3:
        return fp8_rows(w)
    if t == RamlmType.U8_ZP:
        return _u8_zp(w.reshape(-1, block)).reshape(N, -1)
    if t in (Q.Q8_0, RamlmType.Q8_A16):  # gguf's quantizer, bit for bit, in parallel
        return q8_0_rows(w)
    if t == Q.Q4_K:  # _q4_k, bit for bit, in parallel
        return q4_k_rows(w)
    if t == Q.F16:
        return w.astype(np.float16).view(np.uint8).reshape(N, 2 * K)
    if t in _GGUF_QUANTIZERS:
        return np.ascontiguousarray(gguf.quants.quantize(w, t)).view(np.uint8).reshape(N, -1)
    if t == Q.IQ4_NL:
        return _iq4_nl(w).reshape(N, -1)
    if t in _K_QUANTIZERS:
        out = _K_QUANTIZERS[t](w.reshape(-1, QKK))
        assert out.shape[-1] == type_size
        return np.ascontiguousarray(out, dtype=np.uint8).reshape(N, K // block * type_size)
    if t in UNWRITTEN:
        raise NotImplementedError(f"quantize: ramlm runs {t.name} files but does not write them (llama.cpp's "
                                  "llama-quantize does)")
    raise NotImplementedError(f"quantize: {t.name} is not supported")
