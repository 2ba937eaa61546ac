"""Kernels for llama.cpp's grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), ternary
formats (TQ1_0, TQ2_0) and NVFP4: 1.56-4.5 bits a weight, 256-value super-blocks (NVFP4: 64 values, four
unsigned-e4m3 scales).

The weights stay as the file has them (repack.grid_rows only groups rows 8 by 8 and pads N). A GEMV unpacks each
8-row group once into signed bytes + 128 (grids.py's points with their signs: 8 values per three 64-bit
operations) and a float scale per 16 values, laid out as k_iq4.py's unpacked groups (block b's quads k of the 8
rows at 256 b + 32 k, elements 16.. 128 bytes on), then runs Q8_0's integer dots (dot.dpbusd_q8) per 16 values.
The integer dots are exact, so each output is one float scale per 16 values away from the dequantized weights.

Scales per 16 values cover every format: IQ2_XS, IQ2_S, IQ1_M, NVFP4 have them; the others repeat their per-32 or
per-256 scale. IQ1's values g + delta (delta = +-1/8) are held as 8 g +- 1 with the scale divided by 8 (exact).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .dot import Q8_OFFSET, dpbusd_q8
from .grids import (GRID_IQ1_NEG, GRID_IQ1_POS, GRID_IQ2S, GRID_IQ2XS, GRID_IQ2XXS, GRID_IQ3S, GRID_IQ3XXS,
                    KSIGNS, SIGN_MASK)
from .k_bytes import store_rows, store_rows4
from .q8act import quantize_act
from .simd import (CACHE, f16_to_f32, i8_to_f32, load_bcast4, load_f32x8, load_u8x8, load_u8x32, muladd, splat_i32,
                   store, to_f32, vmul, vsub, zero_f32x8)

IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, NVFP4 = range(10)
TYPE_SIZE = (66, 74, 82, 98, 110, 50, 56, 54, 66, 36)  # bytes per super-block, in the order above
SUPER = (256, 256, 256, 256, 256, 256, 256, 256, 256, 64)  # values per super-block
NVFP4_KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int32)  # e2m1, doubled

_LSB = np.uint64(0x0101010101010101)
_HIGH = np.uint64(0x8080808080808080)


@njit(cache=CACHE)
def signed_bytes(mag, sign_bits):
    """8 magnitude bytes (nonzero) with the elements of set sign bits negated, each byte + 128: ((m ^ s) + (s & 1))
    negates the masked bytes without carries, ^ 0x80 adds 128."""
    s = SIGN_MASK[sign_bits]
    return (((mag ^ s) + (s & _LSB)) ^ _HIGH)


@njit(cache=CACHE)
def u16(raw, o):
    return np.uint32(raw[o]) | (np.uint32(raw[o + 1]) << np.uint32(8))


@njit(cache=CACHE)
def u32(raw, o):
    return u16(raw, o) | (u16(raw, o + 2) << np.uint32(16))


@njit(cache=CACHE)
def half(raw, o):
    return f16_to_f32(np.uint16(u16(raw, o)))


@njit(cache=CACHE)
def pair3(grid, i0, i1):
    """Two IQ3 points (4 magnitudes each) as one 8-byte word."""
    return np.uint64(grid[i0]) | (np.uint64(grid[i1]) << np.uint64(32))


@njit(cache=CACHE)
def nibble_scales(raw, o, d, sc):
    """IQ2_XS / IQ2_S: 16 4-bit scales (low nibble first) -> d * (0.5 + s) * 0.25 (gguf's order of operations)."""
    for i in range(16):
        s = (np.int32(raw[o + (i >> 1)]) >> (4 * (i & 1))) & 15
        sc[i] = d * (np.float32(0.5) + np.float32(s)) * np.float32(0.25)


@njit(cache=CACHE)
def unpack_super(raw, o, fmt, vals, sc):
    """The 256-value super-block at raw[o:]: vals (32 uint64) its values + 128, 8 a word (element i in byte i),
    sc (16 float32) the scale of each 16 values."""
    if fmt == IQ2_XXS:
        d = half(raw, o)
        for ib in range(8):
            q = o + 2 + 8 * ib
            aux = u32(raw, q + 4)
            db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.25)
            sc[2 * ib] = db
            sc[2 * ib + 1] = db
            for l in range(4):
                vals[4 * ib + l] = signed_bytes(GRID_IQ2XXS[raw[q + l]], KSIGNS[(aux >> (7 * l)) & 127])
    elif fmt == IQ2_XS:
        d = half(raw, o)
        for j in range(32):
            q = u16(raw, o + 2 + 2 * j)
            vals[j] = signed_bytes(GRID_IQ2XS[q & 511], KSIGNS[q >> 9])
        nibble_scales(raw, o + 66, d, sc)
    elif fmt == IQ2_S:
        d = half(raw, o)
        for j in range(32):
            idx = np.int32(raw[o + 2 + j]) | (((np.int32(raw[o + 66 + (j >> 2)]) >> (2 * (j & 3))) & 3) << 8)
            vals[j] = signed_bytes(GRID_IQ2S[idx], raw[o + 34 + j])
        nibble_scales(raw, o + 74, d, sc)
    elif fmt == IQ3_XXS:
        d = half(raw, o)
        for ib in range(8):
            aux = u32(raw, o + 66 + 4 * ib)
            db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.5)
            sc[2 * ib] = db
            sc[2 * ib + 1] = db
            for l in range(4):
                q = o + 2 + 8 * ib + 2 * l
                vals[4 * ib + l] = signed_bytes(pair3(GRID_IQ3XXS, raw[q], raw[q + 1]), KSIGNS[(aux >> (7 * l)) & 127])
    elif fmt == IQ3_S:
        d = half(raw, o)
        for j in range(32):
            i0, i1 = 2 * j, 2 * j + 1
            h0 = (np.int32(raw[o + 66 + (i0 >> 3)]) >> (i0 & 7)) & 1
            h1 = (np.int32(raw[o + 66 + (i1 >> 3)]) >> (i1 & 7)) & 1
            mag = pair3(GRID_IQ3S, np.int32(raw[o + 2 + i0]) | (h0 << 8), np.int32(raw[o + 2 + i1]) | (h1 << 8))
            vals[j] = signed_bytes(mag, raw[o + 74 + j])
        for ib in range(8):
            s = (np.int32(raw[o + 106 + (ib >> 1)]) >> (4 * (ib & 1))) & 15
            db = d * np.float32(1 + 2 * s)
            sc[2 * ib] = db
            sc[2 * ib + 1] = db
    elif fmt == IQ1_S:
        d = half(raw, o)
        for ib in range(8):
            qh = np.int32(u16(raw, o + 34 + 2 * ib))
            dl = d * np.float32(2 * ((qh >> 12) & 7) + 1) * np.float32(0.125)
            sc[2 * ib] = dl
            sc[2 * ib + 1] = dl
            grid = GRID_IQ1_NEG if qh & 0x8000 else GRID_IQ1_POS
            for l in range(4):
                vals[4 * ib + l] = grid[np.int32(raw[o + 2 + 4 * ib + l]) | (((qh >> (3 * l)) & 7) << 8)]
    elif fmt == IQ1_M:
        s0, s1, s2, s3 = u16(raw, o + 48), u16(raw, o + 50), u16(raw, o + 52), u16(raw, o + 54)
        bits = (s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000)
        d = f16_to_f32(np.uint16(bits))
        for i in range(16):
            w = u16(raw, o + 48 + 2 * (i >> 2))
            s = (np.int32(w) >> (3 * (i & 3))) & 7
            sc[i] = d * np.float32(2 * s + 1) * np.float32(0.125)
        for j in range(32):
            qh = (np.int32(raw[o + 32 + (j >> 1)]) >> (4 * (j & 1))) & 15
            grid = GRID_IQ1_NEG if qh & 8 else GRID_IQ1_POS
            vals[j] = grid[np.int32(raw[o + j]) | ((qh & 7) << 8)]
    elif fmt == TQ1_0:
        d = half(raw, o + 52)
        for i in range(16):
            sc[i] = d
        for j in range(32):
            w = np.uint64(0)
            for i in range(8):
                e = 8 * j + i
                if e < 160:
                    byte, p = raw[o + (e & 31)], e >> 5
                elif e < 240:
                    byte, p = raw[o + 32 + ((e - 160) & 15)], (e - 160) >> 4
                else:
                    byte, p = raw[o + 48 + ((e - 240) & 3)], (e - 240) >> 2
                t = (np.int32(byte) * (3 ** p)) & 255  # the base-3 digit p rotated to the top (uint8 wrap)
                w |= np.uint64(((t * 3) >> 8) + 127) << np.uint64(8 * i)
            vals[j] = w
    elif fmt == NVFP4:
        for i in range(4):
            e = np.int32(raw[o + i])
            if e == 0 or e == 0x7F:
                sc[i] = np.float32(0.0)
            elif (e >> 3) & 15 == 0:
                sc[i] = np.float32(e & 7) * np.float32(2.0 ** -9) * np.float32(0.5)
            else:
                sc[i] = (np.float32(1.0) + np.float32(e & 7) / np.float32(8.0)) * \
                    np.float32(2.0 ** (((e >> 3) & 15) - 7)) * np.float32(0.5)
            for h in range(2):
                w = np.uint64(0)
                for k in range(8):
                    code = (np.int32(raw[o + 4 + 8 * i + k]) >> (4 * h)) & 15
                    w |= np.uint64(NVFP4_KVALUES[code] + 128) << np.uint64(8 * k)
                vals[2 * i + h] = w
    else:  # TQ2_0
        d = half(raw, o + 64)
        for i in range(16):
            sc[i] = d
        for j in range(32):
            w = np.uint64(0)
            for i in range(8):
                e = 8 * j + i
                q = (np.int32(raw[o + 32 * (e >> 7) + (e & 31)]) >> (2 * ((e >> 5) & 3))) & 3
                w |= np.uint64(q + 127) << np.uint64(8 * i)
            vals[j] = w


@njit(cache=CACHE)
def unpack_group(w, g, K, fmt, w8, dw):
    """Rows 8 g..8 g + 7 into w8 (K * 8 bytes: block b's quads k at 256 b + 32 k, row r's 4 bytes at + 4 r,
    elements 16.. 128 bytes on) and dw (K / 2 float32: block b's scales of elements 0..15 of the 8 rows at 16 b,
    of 16..31 at 16 b + 8)."""
    ts, sv = TYPE_SIZE[fmt], SUPER[fmt]
    ns = K // sv
    rb = ns * ts
    w32 = w8.view(np.uint32)
    vals, sc = np.empty(32, np.uint64), np.empty(16, np.float32)
    for r in range(8):
        for s in range(ns):
            unpack_super(w[g], r * rb + s * ts, fmt, vals, sc)
            for j in range(sv // 8):
                b, part = (sv // 32) * s + (j >> 2), j & 3
                base = b * 64 + (part >> 1) * 32 + (part & 1) * 16 + r  # in words: 256 b + 128 h + 32 k + 4 r
                v = vals[j]
                w32[base] = np.uint32(v & np.uint64(0xFFFFFFFF))
                w32[base + 8] = np.uint32(v >> np.uint64(32))
            for i in range(sv // 16):
                dw[((sv // 32) * s + (i >> 1)) * 16 + (i & 1) * 8 + r] = sc[i]


@njit(cache=CACHE)
def row_dot(w8, dw, xq, xd, s16, m, b, acc):
    """acc + row m's block b against the 8 rows: two 16-value integer dots, each times its scale."""
    K = xq.shape[1]
    lo, hi = splat_i32(s16[m, 2 * b]), splat_i32(s16[m, 2 * b + 1])
    x0 = m * K + 32 * b
    for k in range(4):
        lo = dpbusd_q8(lo, load_u8x32(w8, 256 * b + 32 * k), load_bcast4(xq, x0 + 4 * k))
        hi = dpbusd_q8(hi, load_u8x32(w8, 256 * b + 128 + 32 * k), load_bcast4(xq, x0 + 16 + 4 * k))
    acc = muladd(acc, to_f32(lo), vmul(load_f32x8(dw, 16 * b), xd[m, b]))
    return muladd(acc, to_f32(hi), vmul(load_f32x8(dw, 16 * b + 8), xd[m, b]))


@njit(parallel=True, cache=CACHE)
def grid_gemv(w, x, out, fmt):
    """out (M, N) = x (M, K) @ W^T, Q8 activations: each 8-row group unpacked once, then 4-row passes (1-row ones
    below 4 rows), the same arithmetic per row whatever M is."""
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    nb = K // 32
    s16 = np.empty((M, K // 16), np.int32)  # -Q8_OFFSET times each 16 activations' sum: the stored + 128 removed
    for m in range(M):
        for j in range(K // 16):
            s16[m, j] = Q8_OFFSET * (xn4[m, 4 * j] + xn4[m, 4 * j + 1] + xn4[m, 4 * j + 2] + xn4[m, 4 * j + 3])
    for g in prange(w.shape[0]):
        w8, dw = np.empty(K * 8, np.uint8), np.empty(K // 2, np.float32)
        unpack_group(w, g, K, fmt, w8, dw)
        if M < 4:
            for m in range(M):
                acc = zero_f32x8()
                for b in range(nb):
                    acc = row_dot(w8, dw, xq, xd, s16, m, b, acc)
                store_rows(out, m, 8 * g, acc)
            continue
        for m in range(0, M, 4):  # the last pass moved back to end at M
            m0 = min(m, M - 4)
            a0, a1, a2, a3 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
            for b in range(nb):
                a0 = row_dot(w8, dw, xq, xd, s16, m0, b, a0)
                a1 = row_dot(w8, dw, xq, xd, s16, m0 + 1, b, a1)
                a2 = row_dot(w8, dw, xq, xd, s16, m0 + 2, b, a2)
                a3 = row_dot(w8, dw, xq, xd, s16, m0 + 3, b, a3)
            store_rows4(out, m0, 8 * g, a0, a1, a2, a3)


@njit(parallel=True, cache=CACHE)
def grid_deq(w, rows, out, fmt):
    """out[t] = W[rows[t]] (float32, or bf16 bits into uint16): gguf's values, scale times signed grid value."""
    K = out.shape[1]
    ts, sv = TYPE_SIZE[fmt], SUPER[fmt]
    ns = K // sv
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        vals, sc = np.empty(32, np.uint64), np.empty(16, np.float32)
        b8 = vals.view(np.uint8)
        for s in range(ns):
            unpack_super(w[g], r * ns * ts + s * ts, fmt, vals, sc)
            for j in range(sv // 8):
                q = i8_to_f32(vsub(load_u8x8(b8, 8 * j), 128))
                store(out, t * K + sv * s + 8 * j, vmul(q, sc[j >> 1]))


# One entry point per format (the registry's gemv(*packed, x, out) / dequant(*packed, rows, out) contracts).
@njit(cache=CACHE)
def gemv_iq2_xxs(w, x, out):
    grid_gemv(w, x, out, IQ2_XXS)


@njit(cache=CACHE)
def deq_iq2_xxs(w, rows, out):
    grid_deq(w, rows, out, IQ2_XXS)


@njit(cache=CACHE)
def gemv_iq2_xs(w, x, out):
    grid_gemv(w, x, out, IQ2_XS)


@njit(cache=CACHE)
def deq_iq2_xs(w, rows, out):
    grid_deq(w, rows, out, IQ2_XS)


@njit(cache=CACHE)
def gemv_iq2_s(w, x, out):
    grid_gemv(w, x, out, IQ2_S)


@njit(cache=CACHE)
def deq_iq2_s(w, rows, out):
    grid_deq(w, rows, out, IQ2_S)


@njit(cache=CACHE)
def gemv_iq3_xxs(w, x, out):
    grid_gemv(w, x, out, IQ3_XXS)


@njit(cache=CACHE)
def deq_iq3_xxs(w, rows, out):
    grid_deq(w, rows, out, IQ3_XXS)


@njit(cache=CACHE)
def gemv_iq3_s(w, x, out):
    grid_gemv(w, x, out, IQ3_S)


@njit(cache=CACHE)
def deq_iq3_s(w, rows, out):
    grid_deq(w, rows, out, IQ3_S)


@njit(cache=CACHE)
def gemv_iq1_s(w, x, out):
    grid_gemv(w, x, out, IQ1_S)


@njit(cache=CACHE)
def deq_iq1_s(w, rows, out):
    grid_deq(w, rows, out, IQ1_S)


@njit(cache=CACHE)
def gemv_iq1_m(w, x, out):
    grid_gemv(w, x, out, IQ1_M)


@njit(cache=CACHE)
def deq_iq1_m(w, rows, out):
    grid_deq(w, rows, out, IQ1_M)


@njit(cache=CACHE)
def gemv_tq1_0(w, x, out):
    grid_gemv(w, x, out, TQ1_0)


@njit(cache=CACHE)
def deq_tq1_0(w, rows, out):
    grid_deq(w, rows, out, TQ1_0)


@njit(cache=CACHE)
def gemv_tq2_0(w, x, out):
    grid_gemv(w, x, out, TQ2_0)


@njit(cache=CACHE)
def deq_tq2_0(w, rows, out):
    grid_deq(w, rows, out, TQ2_0)


@njit(cache=CACHE)
def gemv_nvfp4(w, x, out):
    grid_gemv(w, x, out, NVFP4)


@njit(cache=CACHE)
def deq_nvfp4(w, rows, out):
    grid_deq(w, rows, out, NVFP4)
