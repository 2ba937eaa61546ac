"""GEMVs of the 8-bit weight-only types (Q8_A16, U8_ZP) with activations kept to 16-bit precision, as vLLM's W8A16
kernels keep them, on the int8 kernels of Q8_0.

x = x8 + r, where x8 is x's Q8 rounding (int8 per 32 values, q8act.py) and r what the rounding left. One call of the
int8 GEMV over the 2M rows [x; r] reads the weights once and gives W x8 and W r8; their sum misses only r's own
rounding, |r| / 254 of a block at most: x's error falls from 1/254 of a block's largest value to about 1/64516.
Each row's result still depends on that row alone.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .k_bytes import gemv_q8_0
from .k_zero_point import gemv_u8zp
from .q8act import quantize_act
from .simd import CACHE


@njit(cache=CACHE)
def with_residuals(x):
    """(R, K) float32: x's rows, then each row minus its Q8 rounding (the int8 values times their block's scale), then
    zero rows up to R = 2M rounded up to a multiple of 4 (the GEMVs' passes take rows 4 at a time: one pass over a
    group's weights for M = 1, where two rows alone would each go over them)."""
    M, K = x.shape
    xq, xd, _, _, _ = quantize_act(x)
    x2 = np.zeros(((2 * M + 3) // 4 * 4, K), np.float32)
    x2[:M] = x
    for m in range(M):
        for i in range(K):
            x2[M + m, i] = x[m, i] - np.float32(np.int8(xq[m, i])) * xd[m, i >> 5]
    return x2


@njit(cache=CACHE)
def add_halves(o2, out):
    """out = o2's first M rows plus its next M."""
    M = out.shape[0]
    for m in range(M):
        out[m] = o2[m] + o2[M + m]


@njit(cache=CACHE)
def gemv_q8_a16(q, d, x, out):
    x2 = with_residuals(x)
    o2 = np.empty((x2.shape[0], out.shape[1]), np.float32)
    gemv_q8_0(q, d, x2, o2)
    add_halves(o2, out)


@njit(cache=CACHE)
def gemv_u8zp_a16(q, d, z, x, out):
    x2 = with_residuals(x)
    o2 = np.empty((x2.shape[0], out.shape[1]), np.float32)
    gemv_u8zp(q, d, z, x2, o2)
    add_halves(o2, out)
