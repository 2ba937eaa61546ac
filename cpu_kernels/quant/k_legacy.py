"""Kernels for the 32-element block formats with nibbles: Q4_1, Q5_1 (Q8_0, Q5_0 and Q4_0: k_bytes.py).

gemv_*(packed..., x f32 (M, K), out f32 (M, N)): out = x @ W^T with Q8 activations. Rows of W run in
parallel; each (m, n) is reduced in the same order whatever M is, so a row's result does not depend
on the batch. deq_*(packed..., rows int64 (T,), out f32 (T, K)): out[t] = W[rows[t]] in float32,
with the same float32 operations as gguf's numpy dequantize; out may also be uint16 (T, K), which
receives the values rounded to bfloat16 bits (QuantLinear's bfloat16 prefill path).
Layouts: see repack.py.
"""
from __future__ import annotations

from numba import njit, prange

from .q8act import quantize_act
from .dot import dpbusd
from .simd import (CACHE, bcast, bits_to_bytes, concat, f16_to_f32, hsum, load_f16x8, load_f32x8, load_u8x16,
                   load_u8x32, muladd, store, to_f32, u8_to_f32, vadd, vand, vmul, vor, vshl, vshr, zero_f32x8,
                   zero_i32x8)


@njit(cache=CACHE)
def nibbles(qs, o):
    """u8x32 of one block's 4-bit values from its 16 bytes at qs.flat[o] (low nibbles first)."""
    v = load_u8x16(qs, o)
    return concat(vand(v, 15), vshr(v, 4))


@njit(cache=CACHE)
def nibbles5(qs, o, h):
    """u8x32 of one block's 5-bit values: nibbles plus bit i of the uint32 h as bit 4 of value i."""
    return vor(nibbles(qs, o), vshl(bits_to_bytes(h), 4))


# Each block: lanes start at -offset * (sum of 4 activations) (the formats store q + offset), gain
# the 4-element dot products of unsigned weights and signed activations, and are added scaled.
# Scales come 8 blocks at a time (fp16 widened, times the activation scales); the rest one by one.
@njit(cache=CACHE)
def blk_q4_1(acc, qs, qh, n, b, m, K, xq, xn4, scale):
    iv = dpbusd(zero_i32x8(), nibbles(qs, n * (K // 2) + b * 16), load_u8x32(xq, m * K + b * 32))
    return muladd(acc, to_f32(iv), scale)


@njit(cache=CACHE)
def blk_q5_1(acc, qs, qh, n, b, m, K, xq, xn4, scale):
    iv = dpbusd(zero_i32x8(), nibbles5(qs, n * (K // 2) + b * 16, qh[n, b]), load_u8x32(xq, m * K + b * 32))
    return muladd(acc, to_f32(iv), scale)


# Q4_0 / Q4_1 ------------------------------------------------------------------------------------
@njit(parallel=True, cache=CACHE)
def gemv_q4_1(qs, d, mn, x, out):
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    N, nb = d.shape
    nb8 = nb - nb % 8
    for n in prange(N):
        for m in range(M):
            acc = zero_f32x8()
            macc = zero_f32x8()  # the mins' share: m_b * (xd_b * sum of block b's activations)
            for b0 in range(0, nb8, 8):
                sv = vmul(load_f16x8(d, n * nb + b0), load_f32x8(xd, m * nb + b0))
                macc = vadd(macc, vmul(load_f16x8(mn, n * nb + b0), load_f32x8(xs32, m * nb + b0)))
                for j in range(8):
                    acc = blk_q4_1(acc, qs, qs, n, b0 + j, m, K, xq, xn4, bcast(sv, j))
            msum = hsum(macc)
            for b in range(nb8, nb):
                acc = blk_q4_1(acc, qs, qs, n, b, m, K, xq, xn4, f16_to_f32(d[n, b]) * xd[m, b])
                msum += f16_to_f32(mn[n, b]) * xs32[m, b]
            out[m, n] = hsum(acc) + msum


@njit(parallel=True, cache=CACHE)
def deq_q4_1(qs, d, mn, rows, out):
    N, nb = d.shape
    K = nb * 32
    for t in prange(rows.shape[0]):
        n = rows[t]
        for b in range(nb):
            q = u8_to_f32(nibbles(qs, n * (K // 2) + b * 16))
            store(out, t * K + b * 32, vadd(vmul(q, f16_to_f32(d[n, b])), f16_to_f32(mn[n, b])))


# Q5_0 / Q5_1 ------------------------------------------------------------------------------------
@njit(parallel=True, cache=CACHE)
def gemv_q5_1(qs, qh, d, mn, x, out):
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    N, nb = d.shape
    nb8 = nb - nb % 8
    for n in prange(N):
        for m in range(M):
            acc = zero_f32x8()
            macc = zero_f32x8()  # the mins' share: m_b * (xd_b * sum of block b's activations)
            for b0 in range(0, nb8, 8):
                sv = vmul(load_f16x8(d, n * nb + b0), load_f32x8(xd, m * nb + b0))
                macc = vadd(macc, vmul(load_f16x8(mn, n * nb + b0), load_f32x8(xs32, m * nb + b0)))
                for j in range(8):
                    acc = blk_q5_1(acc, qs, qh, n, b0 + j, m, K, xq, xn4, bcast(sv, j))
            msum = hsum(macc)
            for b in range(nb8, nb):
                acc = blk_q5_1(acc, qs, qh, n, b, m, K, xq, xn4, f16_to_f32(d[n, b]) * xd[m, b])
                msum += f16_to_f32(mn[n, b]) * xs32[m, b]
            out[m, n] = hsum(acc) + msum


@njit(parallel=True, cache=CACHE)
def deq_q5_1(qs, qh, d, mn, rows, out):
    N, nb = d.shape
    K = nb * 32
    for t in prange(rows.shape[0]):
        n = rows[t]
        for b in range(nb):
            q = u8_to_f32(nibbles5(qs, n * (K // 2) + b * 16, qh[n, b]))
            store(out, t * K + b * 32, vadd(vmul(q, f16_to_f32(d[n, b])), f16_to_f32(mn[n, b])))