"""FP8_E4M3 (qtypes.RamlmType): float8 e4m3fn weights with a float32 scale per 128 values of a row.

Layout after repack.fp8_e4m3: rows in groups of 8 (zero rows pad the last), q uint8 (G, nb * 1024): per group and
128-block the eight rows' 128 bytes one after another (one stream per group; rows K apart aliased in L1 at K = 4096),
d float32 (G, nb * 8): the scales, f uint8 (G, nb): a bit per row whose block holds a subnormal. A group's rows
share each activation load: long rows' activations do not fit L1, and fewer rows per load ran 0.6x Q8_0 at K = 14336.
Activations stay float32, not int8: value = e4m3 * scale exactly as the checkpoint defines it.
gemv_fp8, per group, activation row and block: each row's block sum, then tot += block sum * d (the same operations
whatever M). AVX-512 VBMI + BF16 hosts hold the bytes as fp8_codes.py's codes and multiply their bfloat16 words
(exact) with the activation split into two bfloat16 parts (high + low: about 2^-17 relative per element) by
vdpbf16ps, the flagged blocks' subnormals added from a table; other hosts keep the e4m3 bytes (d times 256), widen
them to float32 (fp8_simd.py) and use FMAs.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .bf16_io import bf16_round
from .fp8_codes import (CODE_LAYOUT, SUB_SCALE, X_SCALE, code_bf16x64, code_subnormal_bf16x64,
                        load_code_x16)
from .fp8_simd import dpbf16, fma, load_e4m3x16, load_i16x32
from .simd import CACHE, hsum, load_f32x16, muladd, prefetch_l2, store, vadd, vmul, zero_f32x16


@njit(cache=CACHE)
def split_bf16(x):
    """x f32 (M, K) -> (high, low) uint16 (M, K) bfloat16 bits with high + low ~ x * X_SCALE, each 64 values in
    CODE_ORDER (of 8 values, the first 4 in the first half, the last 4 in the second)."""
    M, K = x.shape
    xh, xl = np.empty((M, K), np.uint16), np.empty((M, K), np.uint16)
    y, hi = np.empty(K, np.float32), np.empty(K, np.uint32)
    yb, hf = y.view(np.uint32), hi.view(np.float32)
    h16, l16 = np.empty(K, np.uint16), np.empty(K, np.uint16)
    for m in range(M):
        for k in range(K):  # straight loops over whole rows, which LLVM vectorizes
            y[k] = x[m, k] * X_SCALE
            h = bf16_round(yb[k])
            h16[k], hi[k] = h, np.uint32(h) << np.uint32(16)
        for k in range(K):
            y[k] = y[k] - hf[k]
            l16[k] = bf16_round(yb[k])
        for c in range(0, K, 64):
            for p in range(8):
                for j in range(4):
                    a, b = c + 4 * p + j, c + 8 * p + j
                    xh[m, a], xl[m, a], xh[m, a + 32], xl[m, a + 32] = h16[b], l16[b], h16[b + 4], l16[b + 4]
    return xh, xl


@njit(cache=CACHE, inline="always")
def _dots(a0, b0, a1, b1, h0, h1, h2, h3, l0, l1, l2, l3):
    """A row's 128-value block sum from its four word vectors: high parts and low parts in two chains, then added."""
    h = dpbf16(dpbf16(dpbf16(dpbf16(zero_f32x16(), a0, h0), b0, h1), a1, h2), b1, h3)
    low = dpbf16(dpbf16(dpbf16(dpbf16(zero_f32x16(), a0, l0), b0, l1), a1, l2), b1, l3)
    return vadd(h, low)


@njit(cache=CACHE, inline="always")
def _row_bf16(q, o, flags, r, h0, h1, h2, h3, l0, l1, l2, l3):
    """Row r's block sum at q[o:]; a flagged row adds its subnormals' share (their words read as zero)."""
    a0, b0 = code_bf16x64(q, o)
    a1, b1 = code_bf16x64(q, o + 64)
    s = _dots(a0, b0, a1, b1, h0, h1, h2, h3, l0, l1, l2, l3)
    if (flags >> r) & 1:
        a0, b0 = code_subnormal_bf16x64(q, o)
        a1, b1 = code_subnormal_bf16x64(q, o + 64)
        s = vadd(s, vmul(_dots(a0, b0, a1, b1, h0, h1, h2, h3, l0, l1, l2, l3), SUB_SCALE))
    return s


@njit(cache=CACHE, inline="always")
def _store4(out, m, n0, t0, t1, t2, t3):
    """out[m, n0:n0 + 4] = the lane sums, the rows past N dropped."""
    N = out.shape[1]
    if n0 + 3 < N:
        out[m, n0], out[m, n0 + 1], out[m, n0 + 2], out[m, n0 + 3] = hsum(t0), hsum(t1), hsum(t2), hsum(t3)
        return
    if n0 < N:
        out[m, n0] = hsum(t0)
    if n0 + 1 < N:
        out[m, n0 + 1] = hsum(t1)
    if n0 + 2 < N:
        out[m, n0 + 2] = hsum(t2)


FP8_AHEAD = 16384


@njit(cache=CACHE, inline="always")
def _prefetch_group(q, o):
    for line in range(16):  # into L2, 16 group-blocks ahead: DRAM's latency needs more lead than L1 can hold
        prefetch_l2(q, o + FP8_AHEAD + 64 * line)


@njit(parallel=True, cache=CACHE)
def _gemv_bf16(q, d, f, x, out):
    M, K = x.shape
    nb = K // 128
    xh, xl = split_bf16(x)
    for g in prange(q.shape[0]):
        for m in range(M):
            t0, t1, t2, t3 = zero_f32x16(), zero_f32x16(), zero_f32x16(), zero_f32x16()
            t4, t5, t6, t7 = zero_f32x16(), zero_f32x16(), zero_f32x16(), zero_f32x16()
            for b in range(nb):
                o, xo, e, fl = (g * nb + b) * 1024, m * K + b * 128, 8 * b, f[g, b]
                if m == 0:
                    _prefetch_group(q, o)
                h0, h1, h2, h3 = (load_i16x32(xh, xo), load_i16x32(xh, xo + 32), load_i16x32(xh, xo + 64),
                                  load_i16x32(xh, xo + 96))
                l0, l1, l2, l3 = (load_i16x32(xl, xo), load_i16x32(xl, xo + 32), load_i16x32(xl, xo + 64),
                                  load_i16x32(xl, xo + 96))
                t0 = muladd(t0, _row_bf16(q, o, fl, 0, h0, h1, h2, h3, l0, l1, l2, l3), d[g, e])
                t1 = muladd(t1, _row_bf16(q, o + 128, fl, 1, h0, h1, h2, h3, l0, l1, l2, l3), d[g, e + 1])
                t2 = muladd(t2, _row_bf16(q, o + 256, fl, 2, h0, h1, h2, h3, l0, l1, l2, l3), d[g, e + 2])
                t3 = muladd(t3, _row_bf16(q, o + 384, fl, 3, h0, h1, h2, h3, l0, l1, l2, l3), d[g, e + 3])
                t4 = muladd(t4, _row_bf16(q, o + 512, fl, 4, h0, h1, h2, h3, l0, l1, l2, l3), d[g, e + 4])
                t5 = muladd(t5, _row_bf16(q, o + 640, fl, 5, h0, h1, h2, h3, l0, l1, l2, l3), d[g, e + 5])
                t6 = muladd(t6, _row_bf16(q, o + 768, fl, 6, h0, h1, h2, h3, l0, l1, l2, l3), d[g, e + 6])
                t7 = muladd(t7, _row_bf16(q, o + 896, fl, 7, h0, h1, h2, h3, l0, l1, l2, l3), d[g, e + 7])
            _store4(out, m, 8 * g, t0, t1, t2, t3)
            _store4(out, m, 8 * g + 4, t4, t5, t6, t7)


@njit(cache=CACHE, inline="always")
def _block4_f32(q, o, x, xo):
    """The four rows' block sums, each activation vector loaded once: two chains of four FMAs per row."""
    xv = load_f32x16(x, xo)
    a0, a1 = vmul(load_e4m3x16(q, o), xv), vmul(load_e4m3x16(q, o + 128), xv)
    a2, a3 = vmul(load_e4m3x16(q, o + 256), xv), vmul(load_e4m3x16(q, o + 384), xv)
    xv = load_f32x16(x, xo + 64)
    c0, c1 = vmul(load_e4m3x16(q, o + 64), xv), vmul(load_e4m3x16(q, o + 192), xv)
    c2, c3 = vmul(load_e4m3x16(q, o + 320), xv), vmul(load_e4m3x16(q, o + 448), xv)
    for j in range(16, 64, 16):
        xv = load_f32x16(x, xo + j)
        a0, a1 = fma(a0, load_e4m3x16(q, o + j), xv), fma(a1, load_e4m3x16(q, o + 128 + j), xv)
        a2, a3 = fma(a2, load_e4m3x16(q, o + 256 + j), xv), fma(a3, load_e4m3x16(q, o + 384 + j), xv)
        xv = load_f32x16(x, xo + 64 + j)
        c0, c1 = fma(c0, load_e4m3x16(q, o + 64 + j), xv), fma(c1, load_e4m3x16(q, o + 192 + j), xv)
        c2, c3 = fma(c2, load_e4m3x16(q, o + 320 + j), xv), fma(c3, load_e4m3x16(q, o + 448 + j), xv)
    return vadd(a0, c0), vadd(a1, c1), vadd(a2, c2), vadd(a3, c3)


@njit(parallel=True, cache=CACHE)
def _gemv_f32(q, d, f, x, out):
    M, K = x.shape
    nb = K // 128
    for g in prange(q.shape[0]):
        for m in range(M):
            for half in range(2):  # four rows at a time: eight rows' accumulators would not fit 16 AVX2 registers
                t0, t1, t2, t3 = zero_f32x16(), zero_f32x16(), zero_f32x16(), zero_f32x16()
                for b in range(nb):
                    o, e = (g * nb + b) * 1024 + 512 * half, 8 * b + 4 * half
                    if m == 0 and half == 0:
                        _prefetch_group(q, o)
                    s0, s1, s2, s3 = _block4_f32(q, o, x, m * K + b * 128)
                    t0, t1 = muladd(t0, s0, d[g, e]), muladd(t1, s1, d[g, e + 1])
                    t2, t3 = muladd(t2, s2, d[g, e + 2]), muladd(t3, s3, d[g, e + 3])
                _store4(out, m, 8 * g + 4 * half, t0, t1, t2, t3)


gemv_fp8 = _gemv_bf16 if CODE_LAYOUT else _gemv_f32


@njit(parallel=True, cache=CACHE)
def deq_fp8(q, d, f, rows, out):
    K = out.shape[1]
    nb = K // 128
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        for b in range(nb):
            o = (g * nb + b) * 1024 + 128 * r
            for j in range(8):
                if CODE_LAYOUT:  # the codes' scales are 2**48 times the widened values' (exact: a power of two)
                    v = vmul(load_code_x16(q, o + 16 * j), d[g, 8 * b + r] * np.float32(2.0 ** -48))
                else:
                    v = vmul(load_e4m3x16(q, o + 16 * j), d[g, 8 * b + r])
                store(out, t * K + b * 128 + 16 * j, v)
