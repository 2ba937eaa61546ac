"""Numba twins of the numpy repackers of the 8-row interleaved formats: numpy took 0.4-0.8 s of every gemma-3-270m
load on Q8_0/Q5_0 and ~17 s of an 8B load on Q4_K/Q6_K; one parallel pass over the row groups takes tens of ms per
100 MB. Outputs equal repack.*_numpy (tested).

The output arrays are allocated by numpy, which asks the kernel for transparent huge pages on large arrays
(Numba's allocator does not): on 4 KiB pages the TLB misses cost the 262144 x 640 GEMV ~10 % from DRAM."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .fp8_codes import CODE_LAYOUT, D_SCALE, code_of, is_subnormal
from .simd import CACHE


def _arrays(N: int, *specs):
    """One numpy array (G, width) per (width, dtype, pad) spec, G = ceil(N / 8); the last group's rows past N are
    filled with pad before the kernel writes the real ones."""
    G = (N + 7) // 8
    out = tuple(np.empty((G, width), dtype) for width, dtype, _ in specs)
    for a, (_, _, pad) in zip(out, specs):
        a[-1] = pad
    return out


def q8_0(raw):
    """raw uint8 (N, nb * 34) -> q uint8 (G, nb * 256), d uint16 (G, nb * 8): k_bytes' 8-row interleaved layout,
    values + 128 (Q8_0 stores them signed)."""
    nb = raw.shape[1] // 34
    out = _arrays(raw.shape[0], (nb * 256, np.uint8, 128), (nb * 8, np.uint16, 0))
    _q8_0(raw, *out)
    return out


def u8_zp(raw):
    """raw RamlmType.U8_ZP rows uint8 (N, nb * 35) -> q uint8 (G, nb * 256), d uint16 (G, nb * 8), z uint8
    (G, nb * 8): Q8_0's interleaved layout (q holds the unsigned values as they are: Q8_0's value + 128), the zero
    points placed as d."""
    nb = raw.shape[1] // 35
    out = _arrays(raw.shape[0], (nb * 256, np.uint8, 128), (nb * 8, np.uint16, 0), (nb * 8, np.uint8, 128))
    _u8_zp(raw, *out)
    return out


def q5_0(raw):
    """raw uint8 (N, nb * 22) -> qs uint8 (G, nb * 128), qh uint32 (G, nb * 8), d uint16 (G, nb * 8): k_bytes' Q5_0
    layout."""
    N, nb = raw.shape[0], raw.shape[1] // 22
    out = _arrays(N, (nb * 128, np.uint8, 0), (nb * 8, np.uint32, 0), (nb * 8, np.uint16, 0))
    out[1][:] = 0  # the kernel ORs each row's bits into qh
    _q5_0(raw, *out)
    return out


def mxfp4(raw):
    """raw uint8 (N, nb * 17) -> qs uint8 (G, nb * 128), e uint8 (G, nb * 8): k_mxfp4's layout (Q5_0's nibbles)."""
    nb = raw.shape[1] // 17
    out = _arrays(raw.shape[0], (nb * 128, np.uint8, 0), (nb * 8, np.uint8, 0))
    _mxfp4(raw, *out)
    return out


def iq4_xs(raw):
    """raw uint8 (N, ns * 136) -> qs uint8 (G, ns * 1024), sc uint8 (G, ns * 64), d uint16 (G, ns * 8): k_iq4's
    IQ4_XS layout."""
    ns = raw.shape[1] // 136
    out = _arrays(raw.shape[0], (ns * 1024, np.uint8, 0), (ns * 64, np.uint8, 0), (ns * 8, np.uint16, 0))
    _iq4_xs(raw, *out)
    return out


def fp8_e4m3(raw):
    """raw FP8_E4M3 rows uint8 (N, nb * 132) -> q uint8 (G, nb * 1024), d float32 (G, nb * 8), f uint8 (G, nb):
    k_fp8's layout."""
    N, nb = raw.shape[0], raw.shape[1] // 132
    scale = np.ascontiguousarray(raw.reshape(N, nb, 132)[..., :4]).view(np.float32).reshape(N, nb)
    out = _arrays(N, (nb * 1024, np.uint8, 0), (nb * 8, np.float32, 0), (nb, np.uint8, 0))
    _fp8(raw, scale, *out, CODE_LAYOUT)
    return out


def q4_k(raw):
    """raw uint8 (N, ns * 144) -> repack.q4_k_numpy's arrays (k_kquants_x8's layout)."""
    ns = raw.shape[1] // 144
    out = _arrays(raw.shape[0], (ns * 1024, np.uint8, 0), (ns * 64, np.uint8, 0), (ns * 64, np.uint8, 0),
                  (ns * 8, np.uint16, 0), (ns * 8, np.uint16, 0))
    _q4_k(raw, *out)
    return out


def q6_k(raw):
    """raw uint8 (N, ns * 210) -> repack.q6_k_numpy's arrays (k_q6_k_x8's layout)."""
    ns = raw.shape[1] // 210
    out = _arrays(raw.shape[0], (ns * 1024, np.uint8, 0), (ns * 512, np.uint8, 0), (ns * 128, np.int8, 0),
                  (ns * 8, np.uint16, 0))
    _q6_k(raw, out[0], out[1], out[2].view(np.uint8), out[3])
    return out


@njit(cache=CACHE)
def _u16(raw, n, o):
    """The little-endian uint16 at raw[n, o:o + 2] (fp16 scale bits)."""
    return np.uint16(raw[n, o]) | (np.uint16(raw[n, o + 1]) << np.uint16(8))


@njit(parallel=True, cache=CACHE)
def _q8_0(raw, q, d):
    N = raw.shape[0]
    nb = raw.shape[1] // 34
    G = q.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for b in range(nb):
                o = b * 34
                d[g, 8 * b + r] = _u16(raw, n, o)
                for e in range(32):
                    q[g, 256 * b + 32 * (e >> 2) + 4 * r + (e & 3)] = raw[n, o + 2 + e] ^ np.uint8(0x80)


@njit(parallel=True, cache=CACHE)
def _u8_zp(raw, q, d, z):
    N = raw.shape[0]
    nb = raw.shape[1] // 35
    G = q.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for b in range(nb):
                o = b * 35
                d[g, 8 * b + r] = _u16(raw, n, o)
                z[g, 8 * b + r] = raw[n, o + 2]
                for e in range(32):
                    q[g, 256 * b + 32 * (e >> 2) + 4 * r + (e & 3)] = raw[n, o + 3 + e]


@njit(parallel=True, cache=CACHE)
def _q5_0(raw, qs, qh, d):
    N = raw.shape[0]
    nb = raw.shape[1] // 22
    G = qs.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for b in range(nb):
                o = b * 22
                d[g, 8 * b + r] = _u16(raw, n, o)
                h = np.uint32(0)
                for j in range(4):
                    h |= np.uint32(raw[n, o + 2 + j]) << np.uint32(8 * j)
                for k in range(8):
                    qh[g, 8 * b + k] |= ((h >> np.uint32(4 * k)) & np.uint32(15)) << np.uint32(4 * r)
                for e in range(16):
                    qs[g, 128 * b + 32 * (e >> 2) + 4 * r + (e & 3)] = raw[n, o + 6 + e]


@njit(parallel=True, cache=CACHE)
def _mxfp4(raw, qs, e):
    N = raw.shape[0]
    nb = raw.shape[1] // 17
    G = qs.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for b in range(nb):
                o = b * 17
                e[g, 8 * b + r] = raw[n, o]
                for j in range(16):
                    qs[g, 128 * b + 32 * (j >> 2) + 4 * r + (j & 3)] = raw[n, o + 1 + j]


@njit(parallel=True, cache=CACHE)
def _iq4_xs(raw, qs, sc, d):
    N, ns, G = raw.shape[0], raw.shape[1] // 136, qs.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for s in range(ns):
                o = s * 136
                d[g, 8 * s + r] = _u16(raw, n, o)
                h = _u16(raw, n, o + 2)
                for j in range(8):  # ggml's ls: 4 low bits from scales_l, 2 high from scales_h
                    lo = (raw[n, o + 4 + (j >> 1)] >> np.uint8(4 * (j & 1))) & np.uint8(15)
                    sc[g, 64 * s + 8 * j + r] = lo | np.uint8(((h >> np.uint16(2 * j)) & np.uint16(3)) << np.uint16(4))
                    for e in range(16):
                        qs[g, 128 * (8 * s + j) + 32 * (e >> 2) + 4 * r + (e & 3)] = raw[n, o + 8 + 16 * j + e]


@njit(parallel=True, cache=CACHE)
def _fp8(raw, scale, q, d, f, codes):
    nb = scale.shape[1]
    for g in prange(q.shape[0]):
        for b in range(nb):
            flags = 0
            for r in range(min(8, raw.shape[0] - 8 * g)):
                n = 8 * g + r
                d[g, 8 * b + r] = scale[n, b] * (D_SCALE if codes else np.float32(256.0))
                for j in range(128):
                    v = raw[n, 132 * b + 4 + j]
                    if is_subnormal(v):
                        flags |= 1 << r
                    q[g, 1024 * b + 128 * r + j] = code_of(v) if codes else v
            f[g, b] = flags


@njit(parallel=True, cache=CACHE)
def _q4_k(raw, qs, sc, mn, d, dmin):
    N, ns, G = raw.shape[0], raw.shape[1] // 144, qs.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for s in range(ns):
                o = s * 144
                d[g, 8 * s + r] = _u16(raw, n, o)
                dmin[g, 8 * s + r] = _u16(raw, n, o + 2)
                for j in range(4):  # ggml's get_scale_min_k4
                    lo, hi, md = raw[n, o + 4 + j], raw[n, o + 8 + j], raw[n, o + 12 + j]
                    sc[g, 64 * s + 8 * j + r] = lo & np.uint8(63)
                    mn[g, 64 * s + 8 * j + r] = hi & np.uint8(63)
                    sc[g, 64 * s + 8 * (j + 4) + r] = (md & np.uint8(15)) | ((lo >> np.uint8(2)) & np.uint8(0x30))
                    mn[g, 64 * s + 8 * (j + 4) + r] = (md >> np.uint8(4)) | ((hi >> np.uint8(2)) & np.uint8(0x30))
                for c in range(4):
                    for i in range(32):
                        qs[g, 1024 * s + 256 * c + 32 * (i >> 2) + 4 * r + (i & 3)] = raw[n, o + 16 + 32 * c + i]


@njit(parallel=True, cache=CACHE)
def _q6_k(raw, ql, qh, sc, d):
    N, ns, G = raw.shape[0], raw.shape[1] // 210, ql.shape[0]
    for g in prange(G):
        for r in range(min(8, N - 8 * g)):
            n = 8 * g + r
            for s in range(ns):
                o = s * 210
                for bi in range(128):  # ql byte 64 h + 32 p + 4 k + i
                    h, p, k, i = bi >> 6, (bi >> 5) & 1, (bi >> 2) & 7, bi & 3
                    ql[g, 512 * (2 * s + h) + 64 * k + 32 * p + 4 * r + i] = raw[n, o + bi]
                for bi in range(64):  # qh byte 32 h + 4 k + i
                    h, k, i = bi >> 5, (bi >> 2) & 7, bi & 3
                    qh[g, 256 * (2 * s + h) + 32 * k + 4 * r + i] = raw[n, o + 128 + bi]
                for j in range(16):
                    sc[g, 128 * s + 8 * j + r] = raw[n, o + 192 + j]
                d[g, 8 * s + r] = _u16(raw, n, o + 208)
