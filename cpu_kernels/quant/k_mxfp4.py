"""Kernels for MXFP4 (gpt-oss's experts) with rows interleaved 8 by 8, as packed as the file.

A GGUF MXFP4 block is 32 values in 17 bytes: an E8M0 exponent e and 16 bytes of 4-bit codes (low nibble of byte j:
element j, high nibble: element j + 16). Value = KVALUES[code] * 2^(e - 128), KVALUES = twice the E2M1 values, so
every value is a small integer (-12..12) times a power of two: an int8 dot with the activations' Q8 blocks is
exact, and one float multiply by 2^(e - 128) * the activation scale finishes a block (llama.cpp's
ggml_vec_dot_mxfp4_q8_0, with our Q8 activations).

Layout (repack.mxfp4): qs uint8 (G, nb * 128): at 128 b + 32 k + 4 r + i GGUF's qs byte 4 k + i of row r (Q5_0's
placement, k_bytes.py); e uint8 (G, nb * 8): the exponent of (8 g + r, b) at 8 b + r. Rows past N are zero (code
0 is the value 0). The codes become bytes KVALUES + 12 (0..24, below 128 as dpbusd7 wants) by a 16-entry table
lookup (vpshufb on x86 hosts with AVX2, selects in generic IR elsewhere: the same bytes), and each block's integer
dot starts at -12 times the activations' sum (k_bytes.block_offsets), as Q5_0's starts at -16 times it. The
passes then are Q5_0's: short accumulators of 4 dots (2 * 24 * 128 * 4 < 32768), a group's bytes unpacked once for
4-row passes, two groups per 512-bit dot on PAIR hosts; every path gives the same integers and float steps, so the
same bits.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .dot import _x86, acc_i32, dpbusd_acc, zero_acc
from .k_bytes import block_offsets, store_rows, store_rows4
from .q8act import quantize_act
from .simd import (_I32, _ptr, CACHE, HAS_AVX2, HAS_VNNI, PREFETCH_AHEAD, concat, f32x8, i8_to_f32, load_u8x32, muladd,
                   prefetch, store, to_f32, u8x32, vadd, vand, vmul, vshr, vsub, zero_f32x8)
from .simd_lanes import load_bcast4, load_strided4x4, splat_i32
from .wide import byte_pair_passes, pair_units, unit_group

KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # ggml's kvalues_mxfp4
OFFSET = 12  # stored bytes are KVALUES + OFFSET
_LUT = [v + OFFSET for v in KVALUES]
_V32 = ir.VectorType(ir.IntType(8), 32)


def code_table(lut):
    """An intrinsic mapping u8x32 of 4-bit codes (0..15) to u8x32 of lut[code] (16 byte values): vpshufb with the
    table in both 128-bit halves on x86 hosts with AVX2, selects in generic IR elsewhere (the same bytes)."""
    @intrinsic
    def lookup(typingctx, v):
        if v != u8x32:
            return None

        def codegen(context, builder, sig, args):
            idx = args[0]
            if HAS_VNNI or HAS_AVX2:
                return _x86(builder, "llvm.x86.avx2.pshuf.b", _V32, [ir.Constant(_V32, list(lut) * 2), idx])
            out = ir.Constant(_V32, [0] * 32)
            for code, val in enumerate(lut):
                hit = builder.icmp_unsigned("==", idx, ir.Constant(_V32, [code] * 32))
                out = builder.select(hit, ir.Constant(_V32, [val] * 32), out)
            return out
        return u8x32(v), codegen
    return lookup


code_bytes = code_table(_LUT)  # u8x32 of codes -> KVALUES[code] + 12


def _e8m0_bits(builder, e, n):
    """ggml's GGML_E8M0_TO_FP32_HALF on i32 lanes: 2^(e - 128) as float32 bits (e < 2: the subnormals)."""
    vt = ir.VectorType(_I32, n)
    c = lambda x: ir.Constant(vt, [x] * n)  # noqa: E731
    small = builder.icmp_unsigned("<", e, c(2))
    return builder.select(small, builder.shl(c(0x00200000), e), builder.shl(builder.sub(e, c(1)), c(23)))


@intrinsic
def load_e8m0x8(typingctx, arr, idx):
    """f32x8 of 2^(e - 128) for the 8 exponent bytes at arr.flat[idx] (uint8 array)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint8 and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        p = _ptr(context, builder, sig.args[0], args[0], i, ir.VectorType(ir.IntType(8), 8))
        e = builder.zext(builder.load(p, align=1), ir.VectorType(_I32, 8))
        return builder.bitcast(_e8m0_bits(builder, e, 8), ir.VectorType(ir.FloatType(), 8))
    return f32x8(arr, idx), codegen


@intrinsic
def e8m0_to_f32(typingctx, e):
    """2^(e - 128) as a float32 for one exponent byte (gguf's e8m0_to_fp32_half)."""
    if not isinstance(e, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = builder.insert_element(ir.Constant(ir.VectorType(_I32, 1), None),
                                   context.cast(builder, args[0], sig.args[0], types.uint32), ir.Constant(_I32, 0))
        bits = builder.extract_element(_e8m0_bits(builder, v, 1), ir.Constant(_I32, 0))
        return builder.bitcast(bits, ir.FloatType())
    return types.float32(e), codegen


@njit(cache=CACHE)
def mx_quads(qs, g, nb, b, k):
    """u8x32 of code bytes (8 rows x 4) of quads k and k + 4 of block b (k = 0..3): elements 4 k.. and 16 + 4 k.."""
    v = load_u8x32(qs, (g * nb + b) * 128 + 32 * k)
    return code_bytes(vand(v, 15)), code_bytes(vshr(v, 4))


@njit(cache=CACHE)
def prefetch_mx(qs, e, g, nb, b):
    prefetch(qs, (g * nb + b) * 128 + PREFETCH_AHEAD)
    prefetch(qs, (g * nb + b) * 128 + PREFETCH_AHEAD + 64)
    prefetch(e, (g * nb + b) * 8 + PREFETCH_AHEAD // 16)


@njit(cache=CACHE)
def unpack_group(qs, e, g, nb, w8, stride, off):
    """Group g's code bytes into w8: quads k and k + 4 of block b at b * stride + 64 k (+ off) and 32 bytes later
    within the block's second half (stride / 2 on): the layout the passes below read."""
    half = stride // 2
    for b in range(nb):
        prefetch_mx(qs, e, g, nb, b)
        for k in range(4):
            lo, hi = mx_quads(qs, g, nb, b, k)
            store(w8, b * stride + (stride // 8) * k + off, lo)
            store(w8, b * stride + half + (stride // 8) * k + off, hi)


@njit(cache=CACHE)
def mxfp4_pair(qs, e, xq, xd, s, out, g, nb):
    """gemv_mxfp4's 4-row passes over groups g and g + 1 at once (wide.py): both groups' code bytes side by side,
    one 512-bit dot per quad of 16 rows; the same integers, the same bits."""
    w8, dw = np.empty(nb * 512, np.uint8), np.empty(nb * 16, np.float32)
    unpack_group(qs, e, g, nb, w8, 512, 0)
    unpack_group(qs, e, g + 1, nb, w8, 512, 32)
    for b in range(nb):
        store(dw, 16 * b, concat(load_e8m0x8(e, (g * nb + b) * 8), load_e8m0x8(e, ((g + 1) * nb + b) * 8)))
    byte_pair_passes(w8, dw, xq, xd, s, out, g, nb)


@njit(parallel=True, cache=CACHE)
def gemv_mxfp4(qs, e, x, out):
    """out (M, N) = x (M, K) @ W^T for W in repack.mxfp4's layout, with Q8 activations."""
    xq, xd, xn4, xs32, xs16 = quantize_act(x)
    M, K = x.shape
    G = qs.shape[0]
    nb = K // 32
    s = block_offsets(xn4, nb, OFFSET)
    P = pair_units(M, out.shape[1])
    for u in prange(G - P):
        g = unit_group(u, P)
        if g < 2 * P:
            mxfp4_pair(qs, e, xq, xd, s, out, g, nb)
            continue
        if M < 4:
            for m in range(M):
                acc = zero_f32x8()
                for b in range(nb):
                    if m == 0:
                        prefetch_mx(qs, e, g, nb, b)
                    xo = m * K + b * 32
                    a, c = zero_acc(), zero_acc()  # short accumulators: 4 dots of weights below 25 each
                    for k in range(4):
                        lo, hi = mx_quads(qs, g, nb, b, k)
                        a = dpbusd_acc(a, lo, load_bcast4(xq, xo + 4 * k))
                        c = dpbusd_acc(c, hi, load_bcast4(xq, xo + 16 + 4 * k))
                    iv = vadd(splat_i32(s[m, b]), vadd(acc_i32(a), acc_i32(c)))
                    acc = muladd(acc, to_f32(iv), vmul(load_e8m0x8(e, (g * nb + b) * 8), xd[m, b]))
                store_rows(out, m, 8 * g, acc)
            continue
        # The group's code bytes unpacked once (quads k and k + 4 of block b at 256 b + 32 k and 256 b + 128 + 32 k),
        # then read by every 4-row pass (as gemv_q5_0).
        w8 = np.empty(nb * 256, np.uint8)
        unpack_group(qs, e, g, nb, w8, 256, 0)
        for m in range(0, M, 4):  # as gemv_q8_0: the last pass moved back to end at M
            m0 = min(m, M - 4)
            a0, a1, a2, a3 = zero_f32x8(), zero_f32x8(), zero_f32x8(), zero_f32x8()
            for b in range(nb):
                i0, i1, i2, i3 = zero_acc(), zero_acc(), zero_acc(), zero_acc()
                h0, h1, h2, h3 = zero_acc(), zero_acc(), zero_acc(), zero_acc()
                x0 = m0 * K + b * 32
                for k in range(4):
                    lo, hi = load_u8x32(w8, b * 256 + 32 * k), load_u8x32(w8, b * 256 + 32 * k + 128)
                    i0 = dpbusd_acc(i0, lo, load_bcast4(xq, x0 + 4 * k))
                    i1 = dpbusd_acc(i1, lo, load_bcast4(xq, x0 + K + 4 * k))
                    i2 = dpbusd_acc(i2, lo, load_bcast4(xq, x0 + 2 * K + 4 * k))
                    i3 = dpbusd_acc(i3, lo, load_bcast4(xq, x0 + 3 * K + 4 * k))
                    h0 = dpbusd_acc(h0, hi, load_bcast4(xq, x0 + 16 + 4 * k))
                    h1 = dpbusd_acc(h1, hi, load_bcast4(xq, x0 + K + 16 + 4 * k))
                    h2 = dpbusd_acc(h2, hi, load_bcast4(xq, x0 + 2 * K + 16 + 4 * k))
                    h3 = dpbusd_acc(h3, hi, load_bcast4(xq, x0 + 3 * K + 16 + 4 * k))
                dw = load_e8m0x8(e, (g * nb + b) * 8)
                j0 = vadd(splat_i32(s[m0, b]), vadd(acc_i32(i0), acc_i32(h0)))
                a0 = muladd(a0, to_f32(j0), vmul(dw, xd[m0, b]))
                j1 = vadd(splat_i32(s[m0 + 1, b]), vadd(acc_i32(i1), acc_i32(h1)))
                a1 = muladd(a1, to_f32(j1), vmul(dw, xd[m0 + 1, b]))
                j2 = vadd(splat_i32(s[m0 + 2, b]), vadd(acc_i32(i2), acc_i32(h2)))
                a2 = muladd(a2, to_f32(j2), vmul(dw, xd[m0 + 2, b]))
                j3 = vadd(splat_i32(s[m0 + 3, b]), vadd(acc_i32(i3), acc_i32(h3)))
                a3 = muladd(a3, to_f32(j3), vmul(dw, xd[m0 + 3, b]))
            store_rows4(out, m0, 8 * g, a0, a1, a2, a3)


@njit(parallel=True, cache=CACHE)
def deq_mxfp4(qs, e, rows, out):
    """out[t] = W[rows[t]] (float32, or bf16 bits into uint16), gguf's values: KVALUES[code] * 2^(e - 128)."""
    K = out.shape[1]
    nb = K // 32
    for t in prange(rows.shape[0]):
        g, r = rows[t] >> 3, rows[t] & 7
        for b in range(nb):
            v = load_strided4x4(qs, (g * nb + b) * 128 + 4 * r, 32)  # GGUF's 16 qs bytes of the row
            q = code_bytes(concat(vand(v, 15), vshr(v, 4)))
            store(out, t * K + b * 32, vmul(i8_to_f32(vsub(q, OFFSET)), e8m0_to_f32(e[g, 8 * b + r])))
