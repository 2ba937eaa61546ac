"""Repack at load: raw GGUF block rows -> the separate contiguous arrays the kernels read.

Every function takes raw uint8 (N, bytes_per_row) (a read-only memmap is fine: everything is
copied) and returns a tuple of arrays, in the order the format's kernels take them.
The 32-element formats keep their fp16 scales as uint16 bits (widened in the kernels: 2 bytes less
per block to stream); the K-quants' per-256 scales become float32; packed 6-bit sub-scales become one
byte each; quantized values keep GGUF's nibble/bit order, which the kernels decode with vector shifts
and masks.
"""
from __future__ import annotations

import numpy as np

def _blocks(raw: np.ndarray, type_size: int) -> np.ndarray:
    raw = np.asarray(raw).view(np.uint8)
    return raw.reshape(raw.shape[0], -1, type_size)


def _f16(b: np.ndarray) -> np.ndarray:
    """(..., 2) uint8 little-endian fp16 -> float32 (...)."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _f16_bits(b: np.ndarray) -> np.ndarray:
    """(..., 2) uint8 little-endian fp16 -> its uint16 bits (...), contiguous (kernels widen them)."""
    return np.ascontiguousarray(np.ascontiguousarray(b).view("<u2")[..., 0].astype(np.uint16))


def _byte_rows(raw) -> np.ndarray:
    """raw as contiguous uint8 (N, bytes_per_row), what the Numba repackers take."""
    return np.ascontiguousarray(np.asarray(raw).view(np.uint8).reshape(raw.shape[0], -1))


def _bytes(b: np.ndarray) -> np.ndarray:
    """(N, nb, w) -> contiguous (N, nb * w)."""
    return np.ascontiguousarray(b).reshape(b.shape[0], -1)


def q8_0(raw):
    """-> q uint8 (G, K * 8), d fp16 bits uint16 (G, K / 4): rows interleaved 8 by 8 (k_bytes.py's layout),
    values + 128 (unsigned for VNNI)."""
    from . import repack_fast
    return repack_fast.q8_0(_byte_rows(raw))


def u8_zp(raw):
    """RamlmType.U8_ZP rows -> q uint8 (G, K * 8), d fp16 bits uint16 (G, K / 4), z uint8 (G, K / 4): Q8_0's layout
    over the unsigned values, each block's zero point beside its d (k_zero_point.py)."""
    from . import repack_fast
    return repack_fast.u8_zp(_byte_rows(raw))


def q8_0_numpy(raw):
    """q8_0 in numpy (the reference repack_fast is tested against)."""
    b = _blocks(raw, 34)
    return interleave8(b[..., 2:].view(np.int8).astype(np.int16), _f16_bits(b[..., 0:2]))


def interleave8(vals: np.ndarray, d: np.ndarray):
    """(N, nb, 32) integer values and (N, nb) fp16 bits -> k_bytes.py's (q, d): 8-row groups (padded with zero
    rows), each block's bytes ordered quad, row, byte; values + 128."""
    N, nb = d.shape
    G = -(-N // 8)
    v = np.zeros((G * 8, nb, 32), np.int16)
    v[:N] = vals
    dd = np.zeros((G * 8, nb), np.uint16)
    dd[:N] = d
    q = (v + 128).astype(np.uint8).reshape(G, 8, nb, 8, 4).transpose(0, 2, 3, 1, 4)
    dd = dd.reshape(G, 8, nb).transpose(0, 2, 1)
    return np.ascontiguousarray(q).reshape(G, nb * 256), np.ascontiguousarray(dd).reshape(G, nb * 8)


def _as_q5_0(raw):
    """Q4_0 rows as Q5_0 rows with every fifth bit clear (the same nibbles and d)."""
    b = _blocks(raw, 18)
    out = np.zeros(b.shape[:2] + (22,), np.uint8)
    out[..., :2], out[..., 6:] = b[..., :2], b[..., 2:]
    return out.reshape(b.shape[0], -1)


def q4_0(raw):
    """-> qs uint8 (G, K * 4), d fp16 bits uint16 (G, K / 4): Q5_0's layout without qh (k_bytes.py). Value =
    d * (q - 8)."""
    from . import repack_fast
    qs, _, d = repack_fast.q5_0(_as_q5_0(raw))
    return qs, d


def q4_0_numpy(raw):
    """q4_0 in numpy (the reference repack_fast is tested against)."""
    qs, _, d = q5_0_numpy(_as_q5_0(raw))
    return qs, d


def q4_1(raw):
    """-> qs (N, K/2), d fp16 bits uint16, m fp16 bits (N, K/32). Value = d * q + m."""
    b = _blocks(raw, 20)
    return _bytes(b[..., 4:]), _f16_bits(b[..., 0:2]), _f16_bits(b[..., 2:4])


def q5_0(raw):
    """-> qs uint8 (G, K * 4), qh uint32 (G, K / 4), d fp16 bits uint16 (G, K / 4): k_bytes.py's Q5_0 layout (rows
    interleaved 8 by 8, as packed as the file). Value = d * (q - 16)."""
    from . import repack_fast
    return repack_fast.q5_0(_byte_rows(raw))


def q5_0_numpy(raw):
    """q5_0 in numpy (the reference repack_fast is tested against)."""
    b = _blocks(raw, 22)
    N, nb = b.shape[:2]
    G = -(-N // 8)
    qh = np.ascontiguousarray(b[..., 2:6]).view("<u4")[..., 0].astype(np.uint32)
    bits = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1  # (N, nb, 32): element e's fifth bit
    bits = _pad8(bits).reshape(G, 8, nb, 8, 4).transpose(0, 2, 3, 1, 4).reshape(G, nb, 8, 32)  # (g, b, k, 4 r + i)
    words = (bits << np.arange(32, dtype=np.uint32)).sum(-1, dtype=np.uint64).astype(np.uint32)
    qs = _pad8(b[..., 6:]).reshape(G, 8, nb, 4, 4).transpose(0, 2, 3, 1, 4)  # (g, b, k, row, i)
    d = np.moveaxis(_pad8(_f16_bits(b[..., 0:2])).reshape(G, 8, nb), 1, -1)
    return tuple(np.ascontiguousarray(a).reshape(G, -1) for a in (qs, words, d))


def mxfp4(raw):
    """-> qs uint8 (G, K * 4), e uint8 (G, K / 4): k_mxfp4.py's layout (rows interleaved 8 by 8, the nibbles placed
    as Q5_0's qs, the E8M0 exponents as one byte per row and block). Value = kvalues[q] * 2^(e - 128)."""
    from . import repack_fast
    return repack_fast.mxfp4(_byte_rows(raw))


def mxfp4_numpy(raw):
    """mxfp4 in numpy (the reference repack_fast is tested against)."""
    b = _blocks(raw, 17)
    N, nb = b.shape[:2]
    G = -(-N // 8)
    qs = _pad8(b[..., 1:]).reshape(G, 8, nb, 4, 4).transpose(0, 2, 3, 1, 4)  # (g, b, k, row, i)
    e = np.moveaxis(_pad8(b[..., 0]).reshape(G, 8, nb), 1, -1)
    return tuple(np.ascontiguousarray(a).reshape(G, -1) for a in (qs, e))


def iq4_nl(raw):
    """IQ4_NL's block is Q4_0's (fp16 d, 16 bytes of nibbles): q4_0's layout, the nibbles being level codes
    (k_iq4.py)."""
    return q4_0(raw)


def iq4_nl_numpy(raw):
    return q4_0_numpy(raw)


def grid_rows(raw):
    """-> w uint8 (G, 8 * bytes_per_row): the file's rows as they are, 8 to an entry (zero rows pad N), what
    k_grid.py's kernels read (IQ1/IQ2/IQ3 grid formats and TQ1_0/TQ2_0)."""
    b = np.asarray(raw).view(np.uint8)
    b = _pad8(b.reshape(b.shape[0], -1))
    return (np.array(b.reshape(b.shape[0] // 8, -1), copy=True),)


def iq4_xs(raw):
    """-> qs uint8 (G, K * 4) as Q5_0's qs, sc uint8 (G, K / 4) the 6-bit sub-scale of (8 g + r, 32-block b) at
    8 b + r, d fp16 bits uint16 (G, K / 32) per 256 values at 8 s + r: k_iq4.py's IQ4_XS layout."""
    from . import repack_fast
    return repack_fast.iq4_xs(_byte_rows(raw))


def iq4_xs_numpy(raw):
    """iq4_xs in numpy (the reference repack_fast is tested against)."""
    b = _blocks(raw, 136)
    N, ns = b.shape[:2]
    G = -(-N // 8)
    lo = (b[..., 4:8, None] >> np.array([0, 4], np.uint8)) & 15  # (N, ns, 4, 2): sub-block 2 i + j
    hi = (b[..., 2:4].copy().view("<u2")[..., 0, None] >> (2 * np.arange(8, dtype=np.uint16))) & 3
    ls = (lo.reshape(N, ns, 8) | (hi.astype(np.uint8) << 4)).reshape(N, ns * 8)
    qs = _pad8(b[..., 8:].reshape(N, ns * 8, 16)).reshape(G, 8, ns * 8, 4, 4).transpose(0, 2, 3, 1, 4)
    sc = np.moveaxis(_pad8(ls).reshape(G, 8, ns * 8), 1, -1)
    d = np.moveaxis(_pad8(_f16_bits(b[..., 0:2])).reshape(G, 8, ns), 1, -1)
    return tuple(np.ascontiguousarray(a).reshape(G, -1) for a in (qs, sc, d))


def fp8_e4m3(raw):
    """FP8_E4M3 rows -> k_fp8.py's layout: q uint8 (G, K * 8) the e4m3 bytes of 8-row groups, per 128-block row by
    row (fp8_codes.py's codes where CODE_LAYOUT); d float32 (G, K / 16) the scales times 256 (D_SCALE for codes), per
    block row by row; f uint8 (G, K / 128) per block a bit per row holding a subnormal."""
    from . import repack_fast
    return repack_fast.fp8_e4m3(_byte_rows(raw))


def fp8_e4m3_numpy(raw, codes=None):
    """fp8_e4m3 in numpy (the reference repack_fast is tested against)."""
    from .fp8_codes import CODE_LAYOUT, D_SCALE
    codes = CODE_LAYOUT if codes is None else codes
    b = _pad8(_blocks(raw, 132))
    G, nb = b.shape[0] // 8, b.shape[1]
    d = np.ascontiguousarray(b[..., :4]).view(np.float32)[..., 0] * (D_SCALE if codes else np.float32(256.0))
    e = b[..., 4:]
    sub = (((e & 0x78) == 0) & ((e & 0x07) != 0)).any(axis=-1).reshape(G, 8, nb)
    f = (sub.astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    if codes:
        e = (e & 0x80) | ((e & 0x0F) << 3) | ((e >> 4) & 0x07)
    q = e.reshape(G, 8, nb, 128).transpose(0, 2, 1, 3)
    d = d.reshape(G, 8, nb).transpose(0, 2, 1)
    return tuple(np.ascontiguousarray(a).reshape(G, -1) for a in (q, d, f))


def q5_1(raw):
    """-> qs, qh, d, m as Q5_0 plus the block min m. Value = d * q + m."""
    b = _blocks(raw, 24)
    qh = np.ascontiguousarray(b[..., 4:8]).view("<u4")[..., 0].astype(np.uint32)
    return _bytes(b[..., 8:]), qh, _f16_bits(b[..., 0:2]), _f16_bits(b[..., 2:4])


def q2_k(raw):
    """-> qs (N, K/4): per 256, 64 bytes, group j of 32 = bits 2(j%4) of bytes 32(j//4)..+32;
    sc uint8 (N, K/16): low nibble scale, high nibble min per 16; d, dmin f32 (N, K/256).
    Value = d * (sc & 15) * q - dmin * (sc >> 4)."""
    b = _blocks(raw, 84)
    return _bytes(b[..., 16:80]), _bytes(b[..., 0:16]), _f16(b[..., 80:82]), _f16(b[..., 82:84])


def q3_k(raw):
    """-> hmask (N, K/8): bit j of its 32 bytes = high bit of group j; qs (N, K/4) as Q2_K;
    sc int8 (N, K/16) (6-bit scale - 32); d f32 (N, K/256). Value = d * sc * (q2 + 4 * hbit - 4)."""
    b = _blocks(raw, 110)
    s = b[..., 96:108]
    lo = np.concatenate([s[..., 0:8] & 0x0F, s[..., 0:8] >> 4], axis=-1)
    hi = np.concatenate([(s[..., 8:12] >> sh) & 3 for sh in (0, 2, 4, 6)], axis=-1)
    sc = ((lo | (hi << 4)).astype(np.int16) - 32).astype(np.int8)
    return _bytes(b[..., 0:32]), _bytes(b[..., 32:96]), _bytes(sc), _f16(b[..., 108:110])


def _scale_min_k4(s: np.ndarray):
    """(N, ns, 12) packed 6-bit scales and mins -> two uint8 (N, ns, 8)."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def q4_k(raw):
    """-> qs (G, K * 4), sc, mn uint8 (G, K / 4), d, dmin fp16 bits uint16 (G, K / 32): rows interleaved 8 by 8
    (k_kquants_x8.py's layout). Value = d * sc * q - dmin * mn."""
    from . import repack_fast
    return repack_fast.q4_k(_byte_rows(raw))


def q4_k_numpy(raw):
    """q4_k in numpy (the reference repack_fast is tested against; its 6-D transposes took 17 s of an 8B load)."""
    b = _blocks(raw, 144)
    N, ns = b.shape[:2]
    G = -(-N // 8)
    sc, mn = _scale_min_k4(b[..., 4:16])
    qs = _pad8(b[..., 16:]).reshape(G, 8, ns, 4, 8, 4).transpose(0, 2, 3, 4, 1, 5)  # (g, s, chunk, quad, row, byte)

    def per_row(a):  # (N, ns, ...) -> (G, ns, ..., 8): the 8 rows of a group side by side
        a = _pad8(a).reshape((G, 8) + a.shape[1:])
        return np.moveaxis(a, 1, -1)
    return tuple(np.ascontiguousarray(a).reshape(G, -1) for a in (
        qs, per_row(sc), per_row(mn), per_row(_f16_bits(b[..., 0:2])), per_row(_f16_bits(b[..., 2:4]))))


def _pad8(a: np.ndarray) -> np.ndarray:
    """a (N, ...) with zero rows appended up to a multiple of 8."""
    N = a.shape[0]
    if N % 8 == 0:
        return a
    z = np.zeros((N + (-N) % 8,) + a.shape[1:], a.dtype)
    z[:N] = a
    return z


def q5_k(raw):
    """-> qs (N, K/2) as Q4_K, qh (N, K/8): bit j of its 32 bytes = 5th bit of group j;
    sc, mn, d, dmin as Q4_K."""
    b = _blocks(raw, 176)
    sc, mn = _scale_min_k4(b[..., 4:16])
    return (_bytes(b[..., 48:]), _bytes(b[..., 16:48]), _bytes(sc), _bytes(mn),
            _f16(b[..., 0:2]), _f16(b[..., 2:4]))


def q6_k(raw):
    """-> ql (G, K * 4), qh (G, K * 2), sc int8 (G, K / 2), d fp16 bits uint16 (G, K / 32): rows interleaved 8 by 8
    (k_q6_k_x8.py's layout). Value = d * sc * (q - 32)."""
    from . import repack_fast
    return repack_fast.q6_k(_byte_rows(raw))


def q6_k_numpy(raw):
    """q6_k in numpy (the reference repack_fast is tested against)."""
    b = _blocks(raw, 210)
    N, ns = b.shape[:2]
    G = -(-N // 8)
    ql = _pad8(b[..., 0:128]).reshape(G, 8, ns, 2, 2, 8, 4).transpose(0, 2, 3, 5, 4, 1, 6)  # (g, s, h, quad, p, row, i)
    qh = _pad8(b[..., 128:192]).reshape(G, 8, ns, 2, 8, 4).transpose(0, 2, 3, 4, 1, 5)  # (g, s, h, quad, row, i)
    sc = np.moveaxis(_pad8(b[..., 192:208].view(np.int8)).reshape(G, 8, ns, 16), 1, -1)  # (g, s, j, row)
    d = np.moveaxis(_pad8(_f16_bits(b[..., 208:210])).reshape(G, 8, ns), 1, -1)
    return tuple(np.ascontiguousarray(a).reshape(G, -1) for a in (ql, qh, sc, d))


def float_rows(raw, K: int, dtype):
    """F32/F16/BF16: the typed (N, K) array (F16/BF16 as uint16 bits), a read-only view of raw when
    raw is contiguous. Always read-only, so its kernels compile once whether raw is a memmap or not."""
    raw = np.asarray(raw)
    if raw.dtype != dtype:
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(raw.shape[0], -1).view(dtype)
    w = np.ascontiguousarray(raw.reshape(-1, K)).view()
    w.flags.writeable = False
    return (w,)
