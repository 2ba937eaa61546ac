"""GGUF block formats (and ramlm's FP8_E4M3, U8_ZP) dequantized by torch on any device: packed weights stay packed in
device memory.

Each function is gguf-py's numpy `dequantize_blocks` (the oracle cpu_kernels is tested against) written
with torch ops, operation for operation, so the results are bit-equal to it. Input: uint8 blocks
(n, type_size); output: float32 (n, block_size).
"""
from __future__ import annotations

import gguf
import torch

from cpu_kernels.quant.qtypes import QUANT_SIZES, RamlmType, qtype
from gpu_kernels import dequant_grid

Q = gguf.GGMLQuantizationType
QK_K = 256


def _f16(b: torch.Tensor) -> torch.Tensor:
    """uint8 (n, 2) -> float32 (n, 1)."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def _shifts(vals, shape, device) -> torch.Tensor:
    return torch.tensor(vals, dtype=torch.uint8, device=device).reshape(shape)


def _nibbles(qs: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """qs (n, groups * width) -> (n, groups * 2 * width): per group the low nibbles, then the high ones."""
    n = qs.shape[0]
    x = qs.reshape(n, groups, 1, width) >> _shifts([0, 4], (1, 1, 2, 1), qs.device)
    return (x & 0x0F).reshape(n, -1)


def _bits(words: torch.Tensor) -> torch.Tensor:
    """uint8 (n, 4) little-endian uint32 -> its 32 bits (n, 32) as uint8."""
    w = words.contiguous().view(torch.int32)  # arithmetic shift; bit 31 masked with & 1 below
    sh = torch.arange(32, dtype=torch.int32, device=words.device).reshape(1, 32)
    return ((w >> sh) & 1).to(torch.uint8)


def q4_0(b):
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:], 1, 16).to(torch.int8) - 8
    return d * q.to(torch.float32)


def q4_1(b):
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return d * _nibbles(b[:, 4:], 1, 16).to(torch.float32) + m


def q5_0(b):
    d = _f16(b[:, :2])
    q = (_nibbles(b[:, 6:], 1, 16) | (_bits(b[:, 2:6]) << 4)).to(torch.int8) - 16
    return d * q.to(torch.float32)


def q5_1(b):
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:], 1, 16) | (_bits(b[:, 4:8]) << 4)
    return d * q.to(torch.float32) + m


def q8_0(b):
    d = _f16(b[:, :2])
    return b[:, 2:].contiguous().view(torch.int8).to(torch.float32) * d


def q2_k(b):
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0xF).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    q = (qs.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)) & 3
    q = q.reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, -1)


def q3_k(b):
    n, dev = b.shape[0], b.device
    hmask, qs, scales = b[:, :32], b[:, 32:96], b[:, 96:108]
    d = _f16(b[:, 108:110])
    ls = (scales[:, :8].reshape(n, 1, 8) >> _shifts([0, 4], (1, 2, 1), dev)).reshape(n, 16)
    hs = (scales[:, 8:12].reshape(n, 1, 4) >> _shifts([0, 2, 4, 6], (1, 4, 1), dev)).reshape(n, 16)
    sc = ((ls & 0x0F) | ((hs & 0x03) << 4)).to(torch.int8) - 32
    dl = (d * sc.to(torch.float32)).reshape(n, 16, 1)
    ql = (qs.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), dev)).reshape(n, 16, 16) & 3
    qh = (hmask.reshape(n, -1, 1, 32) >> _shifts(list(range(8)), (1, 1, 8, 1), dev)).reshape(n, 16, 16) & 1
    qh = qh ^ 1  # the offset is zero when the bit is set
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).to(torch.float32)
    return (dl * q).reshape(n, QK_K)


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def q4_k(b):
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    dm = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    q = _nibbles(b[:, 16:], 4, 32).reshape(n, -1, 32).to(torch.float32)
    return (d * q - dm).reshape(n, QK_K)


def q5_k(b):
    n, dev = b.shape[0], b.device
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    dm = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    ql = _nibbles(b[:, 48:], 4, 32).reshape(n, -1, 32)
    qh = (b[:, 16:48].reshape(n, -1, 1, 32) >> _shifts(list(range(8)), (1, 1, 8, 1), dev)) & 1
    q = (ql | (qh.reshape(n, -1, 32) << 4)).to(torch.float32)
    return (d * q - dm).reshape(n, QK_K)


def q6_k(b):
    n, dev = b.shape[0], b.device
    ql, qh, scales = b[:, :128], b[:, 128:192], b[:, 192:208]
    d = _f16(b[:, 208:210])
    d = (d * scales.contiguous().view(torch.int8).to(torch.float32)).reshape(n, 16, 1)
    lo = _nibbles(ql, 2, 64).reshape(n, -1, 32)
    hi = ((qh.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), dev)) & 3).reshape(n, -1, 32)
    q = (lo | (hi << 4)).to(torch.int8) - 32
    return (d * q.reshape(n, 16, -1).to(torch.float32)).reshape(n, QK_K)


MXFP4_KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def mxfp4(b):
    # gguf's MXFP4: e8m0_to_fp32_half(e) (2^(e - 128), subnormal for e < 2) times the code's kvalue.
    e = b[:, :1].to(torch.int32)
    bits = torch.where(e < 2, torch.bitwise_left_shift(torch.full_like(e, 0x00200000), e), (e - 1) << 23)
    d = bits.view(torch.float32)
    table = torch.tensor(MXFP4_KVALUES, dtype=torch.float32, device=b.device)
    return d * table[_nibbles(b[:, 1:], 1, 16).to(torch.int64)]


IQ4_KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _iq4_levels(codes: torch.Tensor) -> torch.Tensor:
    return torch.tensor(IQ4_KVALUES, dtype=torch.float32, device=codes.device)[codes.to(torch.int64)]


def iq4_nl(b):
    return _f16(b[:, :2]) * _iq4_levels(_nibbles(b[:, 2:], 1, 16))


def iq4_xs(b):
    # gguf's IQ4_XS: per 32 values d * (ls - 32), ls = 4 bits of scales_l | 2 bits of scales_h << 4.
    n, dev = b.shape[0], b.device
    lo = _nibbles(b[:, 4:8], 4, 1)
    hi = (b[:, 2:4].contiguous().view(torch.int16).to(torch.int32) >> torch.arange(0, 16, 2, device=dev)) & 3
    ls = (lo.to(torch.int32) | (hi << 4)) - 32
    dl = (_f16(b[:, :2]) * ls.to(torch.float32)).reshape(n, 8, 1)
    return (dl * _iq4_levels(_nibbles(b[:, 8:], 8, 16)).reshape(n, 8, 32)).reshape(n, QK_K)


def fp8_e4m3(b: torch.Tensor) -> torch.Tensor:
    """RamlmType.FP8_E4M3 blocks: float32 scale, 128 e4m3fn bytes (value = e4m3 * scale, rounded once)."""
    d = b[:, :4].contiguous().view(torch.float32)
    return b[:, 4:].contiguous().view(torch.float8_e4m3fn).to(torch.float32) * d


def u8_zp(b: torch.Tensor) -> torch.Tensor:
    """RamlmType.U8_ZP blocks: fp16 d, uint8 zero point z, 32 uint8 q (value = (q - z) * d, exact in float32)."""
    return (b[:, 3:].to(torch.float32) - b[:, 2:3].to(torch.float32)) * _f16(b[:, :2])


DEQUANT = {Q.Q4_0: q4_0, Q.Q4_1: q4_1, Q.Q5_0: q5_0, Q.Q5_1: q5_1, Q.Q8_0: q8_0, Q.Q2_K: q2_k,
           Q.Q3_K: q3_k, Q.Q4_K: q4_k, Q.Q5_K: q5_k, Q.Q6_K: q6_k, Q.MXFP4: mxfp4, Q.IQ4_NL: iq4_nl,
           Q.IQ4_XS: iq4_xs, RamlmType.FP8_E4M3: fp8_e4m3, RamlmType.U8_ZP: u8_zp, RamlmType.Q8_A16: q8_0,
           **{getattr(Q, name.upper()): getattr(dequant_grid, name) for name in (
               "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "tq1_0", "tq2_0", "nvfp4")}}
FLOAT_TYPES = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}


def has_device_dequant(ggml_type) -> bool:
    """Whether weights of this type can stay packed on a torch device."""
    t = qtype(ggml_type)
    return t in DEQUANT or t in FLOAT_TYPES


def dequantize_rows(raw: torch.Tensor, ggml_type, K: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """raw: GGUF rows as stored, uint8 (N, row_bytes), or typed (N, K) for F32/F16/BF16 -> (N, K) `dtype`."""
    t = qtype(ggml_type)
    if t in FLOAT_TYPES:
        return raw.to(dtype)
    block, size = QUANT_SIZES[t]
    N = raw.shape[0]
    return DEQUANT[t](raw.reshape(-1, size)).reshape(N, K).to(dtype)
