"""GGUF block formats dequantized inside Triton kernels, element by element.

Every function takes `blk`, a (R, C) tensor of uint8 pointers to the start of the GGUF block each element
lives in, `e` (1, C) int32, the element's index inside its block, and `mask` (R, C); it returns the
float32 values (R, C). The arithmetic is gguf-py's `dequantize_blocks` (as gpu_kernels/dequant.py), one
rounding per operation, so with FP fusion off the values are bit-equal to the gguf oracle. Importing this
module imports triton: only the Triton kernels import it.
"""
from __future__ import annotations

import gguf
import triton
import triton.language as tl

Q = gguf.GGMLQuantizationType
# The gguf type ids the kernels are specialized on (a constexpr per launch).
FORMAT_IDS = {q: int(q) for q in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                                  Q.MXFP4, Q.IQ4_NL, Q.IQ4_XS)}


@triton.jit
def _u8(p, mask):
    return tl.load(p, mask=mask, other=0).to(tl.int32)


@triton.jit
def _i8(p, mask):
    return tl.load(p, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _f16(p, mask):
    # Two byte loads: block starts are only 2-byte aligned for some formats, and 1-byte for Q5_0's qh.
    lo = tl.load(p, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(p + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _nibble32(blk, e, mask):
    # 32-element blocks: element e < 16 is the low nibble of byte e, e >= 16 the high nibble of byte e - 16.
    return (_u8(blk + e % 16, mask) >> ((e // 16) * 4)) & 0xF


@triton.jit
def _bit(blk, i, mask):
    # bit i of the little-endian bit string at blk.
    return (_u8(blk + i // 8, mask) >> (i % 8)) & 1


@triton.jit
def _q4_0(blk, e, mask):
    d = _f16(blk, mask)
    return d * (_nibble32(blk + 2, e, mask) - 8).to(tl.float32)


@triton.jit
def _q4_1(blk, e, mask):
    d, m = _f16(blk, mask), _f16(blk + 2, mask)
    return d * _nibble32(blk + 4, e, mask).to(tl.float32) + m


@triton.jit
def _q5_0(blk, e, mask):
    d = _f16(blk, mask)
    q = _nibble32(blk + 6, e, mask) | (_bit(blk + 2, e, mask) << 4)
    return d * (q - 16).to(tl.float32)


@triton.jit
def _q5_1(blk, e, mask):
    d, m = _f16(blk, mask), _f16(blk + 2, mask)
    q = _nibble32(blk + 8, e, mask) | (_bit(blk + 4, e, mask) << 4)
    return d * q.to(tl.float32) + m


@triton.jit
def _q8_0(blk, e, mask):
    return _i8(blk + 2 + e, mask) * _f16(blk, mask)


@triton.jit
def _crumb(qs, e, mask):
    # 2-bit fields of Q2_K/Q3_K: 128-element halves of 32 bytes, shifted by 0, 2, 4, 6 per 32 elements.
    return (_u8(qs + 32 * (e // 128) + e % 32, mask) >> (2 * ((e % 128) // 32))) & 3


@triton.jit
def _q2_k(blk, e, mask):
    sc = _u8(blk + e // 16, mask)
    d, dmin = _f16(blk + 80, mask), _f16(blk + 82, mask)
    dl, ml = d * (sc & 0xF).to(tl.float32), dmin * (sc >> 4).to(tl.float32)
    return dl * _crumb(blk + 16, e, mask).to(tl.float32) - ml


@triton.jit
def _q3_k(blk, e, mask):
    g = e // 16
    ls = (_u8(blk + 96 + g % 8, mask) >> (4 * (g // 8))) & 0xF
    hs = (_u8(blk + 104 + g % 4, mask) >> (2 * (g // 4))) & 3
    dl = _f16(blk + 108, mask) * ((ls | (hs << 4)) - 32).to(tl.float32)
    high = (_u8(blk + e % 32, mask) >> (e // 32)) & 1
    q = _crumb(blk + 32, e, mask) - ((high ^ 1) << 2)  # the offset is 4 when the high bit is clear
    return dl * q.to(tl.float32)


@triton.jit
def _scale_min_k4(scales, e, mask):
    # 6-bit scale and min of sub-block e // 32 from the 12 packed bytes (ggml's get_scale_min_k4).
    j = e // 32
    a = _u8(scales + j % 4, mask)
    b = _u8(scales + 4 + j % 4, mask)
    c = _u8(scales + 8 + j % 4, mask)
    low = j < 4
    sc = tl.where(low, a & 63, (c & 0xF) | ((a >> 6) << 4))
    mn = tl.where(low, b & 63, (c >> 4) | ((b >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _nibble256(qs, e, mask):
    # Q4_K/Q5_K: 64-element chunks of 32 bytes, low nibbles first, then the high ones.
    return (_u8(qs + 32 * (e // 64) + e % 32, mask) >> (4 * ((e // 32) % 2))) & 0xF


@triton.jit
def _q4_k(blk, e, mask):
    sc, mn = _scale_min_k4(blk + 4, e, mask)
    d, dm = _f16(blk, mask) * sc, _f16(blk + 2, mask) * mn
    return d * _nibble256(blk + 16, e, mask).to(tl.float32) - dm


@triton.jit
def _q5_k(blk, e, mask):
    sc, mn = _scale_min_k4(blk + 4, e, mask)
    d, dm = _f16(blk, mask) * sc, _f16(blk + 2, mask) * mn
    high = (_u8(blk + 16 + e % 32, mask) >> (e // 32)) & 1
    q = _nibble256(blk + 48, e, mask) | (high << 4)
    return d * q.to(tl.float32) - dm


@triton.jit
def _q6_k(blk, e, mask):
    w = e % 128
    lo = (_u8(blk + 64 * (e // 128) + w % 64, mask) >> (4 * (w // 64))) & 0xF
    hi = (_u8(blk + 128 + 32 * (e // 128) + w % 32, mask) >> (2 * (w // 32))) & 3
    d = _f16(blk + 208, mask) * _i8(blk + 192 + e // 16, mask)
    return d * ((lo | (hi << 4)) - 32).to(tl.float32)


@triton.jit
def _mxfp4(blk, e, mask):
    # 2^(e8 - 128) (ggml's E8M0_TO_FP32_HALF bits, subnormal below 2) times the code's kvalue, as gguf computes it.
    e8 = _u8(blk, mask)
    bits = tl.where(e8 < 2, 0x00200000 << e8, (e8 - 1) << 23)
    d = bits.to(tl.float32, bitcast=True)
    code = _nibble32(blk + 1, e, mask)
    m = code & 7
    mag = tl.where(m < 4, m, (2 + (m & 1)) << tl.maximum((m >> 1) - 1, 0))  # 4, 6, 8, 12 for 4..7
    return d * tl.where(code >= 8, -mag, mag).to(tl.float32)


@triton.jit
def _iq4_level(code):
    # ggml's kvalues_iq4nl[code], as a select tree (Triton has no constant tables).
    lo = tl.where(code < 4, tl.where(code < 2, tl.where(code == 0, -127, -104), tl.where(code == 2, -83, -65)),
                  tl.where(code < 6, tl.where(code == 4, -49, -35), tl.where(code == 6, -22, -10)))
    hi = tl.where(code < 12, tl.where(code < 10, tl.where(code == 8, 1, 13), tl.where(code == 10, 25, 38)),
                  tl.where(code < 14, tl.where(code == 12, 53, 69), tl.where(code == 14, 89, 113)))
    return tl.where(code < 8, lo, hi).to(tl.float32)


@triton.jit
def _iq4_nl(blk, e, mask):
    return _f16(blk, mask) * _iq4_level(_nibble32(blk + 2, e, mask))


@triton.jit
def _iq4_xs(blk, e, mask):
    ib = e // 32
    sh = _u8(blk + 2, mask) | (_u8(blk + 3, mask) << 8)
    ls = ((_u8(blk + 4 + ib // 2, mask) >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)
    dl = _f16(blk, mask) * (ls - 32).to(tl.float32)
    return dl * _iq4_level(_nibble32(blk + 8 + 16 * ib, e % 32, mask))


@triton.jit
def dequant(FMT: tl.constexpr, blk, e, mask):
    """Values of the elements at (blk, e) for gguf type id FMT (a key of FORMAT_IDS), float32."""
    if FMT == 2:
        w = _q4_0(blk, e, mask)
    elif FMT == 3:
        w = _q4_1(blk, e, mask)
    elif FMT == 6:
        w = _q5_0(blk, e, mask)
    elif FMT == 7:
        w = _q5_1(blk, e, mask)
    elif FMT == 8:
        w = _q8_0(blk, e, mask)
    elif FMT == 10:
        w = _q2_k(blk, e, mask)
    elif FMT == 11:
        w = _q3_k(blk, e, mask)
    elif FMT == 12:
        w = _q4_k(blk, e, mask)
    elif FMT == 13:
        w = _q5_k(blk, e, mask)
    elif FMT == 39:
        w = _mxfp4(blk, e, mask)
    elif FMT == 20:
        w = _iq4_nl(blk, e, mask)
    elif FMT == 23:
        w = _iq4_xs(blk, e, mask)
    else:
        tl.static_assert(FMT == 14, "dequant: no Triton dequantizer for this gguf type")
        w = _q6_k(blk, e, mask)
    return w
