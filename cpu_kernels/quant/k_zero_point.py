"""Kernels for U8_ZP (qtypes.RamlmType): asymmetric 8-bit weights, value = d * (q - z) per 32-value block.

Layout (repack.u8_zp): Q8_0's (k_bytes.py), whose bytes hold Q8_0's value + 128: here the unsigned q as they are, so
Q8_0's kernels read them as d * (q - 128); z uint8 (G, nb * 8) beside d. The GEMV is then Q8_0's (its multi-row
passes, its VNNI dots) less, per block, d * (z - 128) times the block's activation sum xd * sum(xq): the exact
integer sum of what Q8_0's dots multiplied, so the result is x's Q8 rounding times the checkpoint's values, as the
dense path computes it. A row's result does not depend on M (both parts are per row).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .k_bytes import gemv_q8_0
from .q8act import quantize_act
from .simd import (CACHE, f16_to_f32, load_f16x8, load_f32x8, load_u8x8, muladd, store, u8_to_f32, vadd, vmul, vsub,
                   zero_f32x8)
from .simd_lanes import lane, load_strided4


@njit(cache=CACHE)
def gemv_u8zp(q, d, z, x, out):
    """The registry's gemv: Q8_0's over the unsigned bytes, then the zero points' share."""
    gemv_q8_0(q, d, x, out)
    add_zero_points(d, z, x, out)


@njit(parallel=True, cache=CACHE)
def add_zero_points(d, z, x, out):
    """out[m, n] -= sum over blocks b of d[n, b] * (z[n, b] - 128) * xs32[m, b]: Q8_0's dots took each q as q - 128.
    A group's 8 rows are the 8 lanes (d and z sit row by row per block); d * (z - 128) is exact in float32."""
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, N = out.shape
    G, nb = d.shape[0], d.shape[1] // 8
    for g in prange(G):
        shift = np.empty(nb * 8, np.float32)  # d * (z - 128) of the group's blocks, once for all its rows
        for b in range(nb):
            o = g * nb * 8 + 8 * b
            store(shift, 8 * b, vmul(vsub(u8_to_f32(load_u8x8(z, o)), np.float32(128)), load_f16x8(d, o)))
        for m in range(M):
            # four chains over the blocks (one chain waited on each add's latency), summed in a fixed order
            a0, a1, a2, a3 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
            for b in range(0, nb - nb % 4, 4):
                a0 = muladd(a0, load_f32x8(shift, 8 * b), xs32[m, b])
                a1 = muladd(a1, load_f32x8(shift, 8 * b + 8), xs32[m, b + 1])
                a2 = muladd(a2, load_f32x8(shift, 8 * b + 16), xs32[m, b + 2])
                a3 = muladd(a3, load_f32x8(shift, 8 * b + 24), xs32[m, b + 3])
            for b in range(nb - nb % 4, nb):
                a0 = muladd(a0, load_f32x8(shift, 8 * b), xs32[m, b])
            acc = vadd(vadd(a0, a1), vadd(a2, a3))
            for r in range(min(8, N - 8 * g)):
                out[m, 8 * g + r] -= lane(acc, r)


@njit(parallel=True, cache=CACHE)
def deq_u8zp(q, d, z, rows, out):
    K = out.shape[1]
    nb = K // 32
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        for b in range(nb):
            v = vsub(u8_to_f32(load_strided4(q, (g * nb + b) * 256 + 4 * r, 32)), np.float32(z[g, 8 * b + r]))
            store(out, t * K + b * 32, vmul(v, f16_to_f32(d[g, 8 * b + r])))
