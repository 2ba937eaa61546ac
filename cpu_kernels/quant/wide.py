"""512-bit int8 pieces for the GEMVs' two-group passes (q8_0_pair and q5_0_pair in k_bytes.py, q4_k_pair in
k_kquants_x8.py, q6_k_pair in k_q6_k_x8.py): two 8-row groups side by side in one vector.

One zmm vpdpbusd multiplies the same broadcast activation quad by both groups' quads, so a 4-row pass over two
groups issues half the instructions of two passes over one (the 262144 x 640 Q8_0 output matrix at M = 16: 26-28
-> 17.6-18.5 ms on Zen 4). Each lane is still one weight row's exact integer dot, so the results are bitwise those
of the 8-lane kernels. Used where the host has AVX-512 VNNI (PAIR); elsewhere the generic IR keeps them correct.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .dot import _dpbusd_generic
from .simd import (_I32, CACHE, HAS_VNNI, Vec, _make_load, load_f32x16, muladd, store, to_f32, vmul, zero_f32x16)
from .simd_lanes import _make_load_bcast4, _make_splat_i32

# Two-group passes from this many activation rows: at M = 4 the single-group kernel was faster (9.2 vs 10.1 ms
# on the output matrix), from M = 8 the pair (11.2 vs 13.1 ms; M = 32 28.4 vs 41.2).
PAIR_MIN_M = 8
PAIR = HAS_VNNI

u8x64, i32x16 = Vec("i8", 64), Vec("i32", 16)
load_u8x64 = _make_load(u8x64, (types.uint8, types.int8))
_V16 = ir.VectorType(_I32, 16)


@intrinsic
def dpbusd16(typingctx, acc, a, b):
    """i32x16 acc + dot products of 4-byte groups: unsigned bytes a x signed bytes b (u8x64 each)."""
    if not (acc == i32x16 and a == u8x64 and b == u8x64):
        return None

    def codegen(context, builder, sig, args):
        vacc, va, vb = args
        if HAS_VNNI:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16] * 3),
                                                "llvm.x86.avx512.vpdpbusd.512")
            return builder.call(fn, [vacc, builder.bitcast(va, _V16), builder.bitcast(vb, _V16)])
        return _dpbusd_generic(builder, vacc, va, vb, 16)
    return i32x16(acc, a, b), codegen


load_bcast4x16 = _make_load_bcast4(16)  # u8x64: the 4 bytes at arr.flat[idx] in each of 16 dword lanes
splat_i32x16 = _make_splat_i32(16)  # i32x16 with every lane s


@njit(cache=CACHE)
def store16x4(out, m0, n0, a0, a1, a2, a3):
    """out[m0 + i, n0:n0 + 16] = ai for a 4-row pass over two groups (the callers pair only whole groups below N:
    a tail check here, even one never taken, made the pass ~20 % slower)."""
    N = out.shape[1]
    store(out, m0 * N + n0, a0)
    store(out, (m0 + 1) * N + n0, a1)
    store(out, (m0 + 2) * N + n0, a2)
    store(out, (m0 + 3) * N + n0, a3)


@njit(cache=CACHE)
def byte_pair_passes(w8, dw, xq, xd, s, out, g, nb):
    """The 4-row passes over groups g and g + 1 of the formats whose 32-value blocks unpack to bytes in halves
    (Q5_0/Q4_0, MXFP4, IQ4): w8 holds block b's quads k of both groups at 512 b + 64 k (elements 4 k..) and
    256 bytes on (elements 16 + 4 k..), dw (nb * 16) float32 the 16 rows' scales of each block, s the blocks'
    integer offsets. Each lane is one row's exact integer dot, so the results are those of the 8-lane passes."""
    M, K = xq.shape
    for m in range(0, M, 4):
        m0 = min(m, M - 4)
        a0, a1, a2, a3 = zero_f32x16(), zero_f32x16(), zero_f32x16(), zero_f32x16()
        for b in range(nb):
            i0, i1 = splat_i32x16(s[m0, b]), splat_i32x16(s[m0 + 1, b])
            i2, i3 = splat_i32x16(s[m0 + 2, b]), splat_i32x16(s[m0 + 3, b])
            x0 = m0 * K + b * 32
            for k in range(4):
                lo, hi = load_u8x64(w8, b * 512 + 64 * k), load_u8x64(w8, b * 512 + 256 + 64 * k)
                i0 = dpbusd16(dpbusd16(i0, lo, load_bcast4x16(xq, x0 + 4 * k)), hi, load_bcast4x16(xq, x0 + 16 + 4 * k))
                i1 = dpbusd16(dpbusd16(i1, lo, load_bcast4x16(xq, x0 + K + 4 * k)), hi,
                              load_bcast4x16(xq, x0 + K + 16 + 4 * k))
                i2 = dpbusd16(dpbusd16(i2, lo, load_bcast4x16(xq, x0 + 2 * K + 4 * k)), hi,
                              load_bcast4x16(xq, x0 + 2 * K + 16 + 4 * k))
                i3 = dpbusd16(dpbusd16(i3, lo, load_bcast4x16(xq, x0 + 3 * K + 4 * k)), hi,
                              load_bcast4x16(xq, x0 + 3 * K + 16 + 4 * k))
            d = load_f32x16(dw, 16 * b)
            a0 = muladd(a0, to_f32(i0), vmul(d, xd[m0, b]))
            a1 = muladd(a1, to_f32(i1), vmul(d, xd[m0 + 1, b]))
            a2 = muladd(a2, to_f32(i2), vmul(d, xd[m0 + 2, b]))
            a3 = muladd(a3, to_f32(i3), vmul(d, xd[m0 + 3, b]))
        store16x4(out, m0, 8 * g, a0, a1, a2, a3)


@njit(cache=CACHE)
def pair_units(M, N):
    """How many group pairs a GEMV of M rows over N outputs runs: whole 16-row pairs below N on PAIR hosts from
    PAIR_MIN_M rows, else 0. The work units are then those pairs followed by the remaining single groups."""
    return N // 16 if PAIR and M >= PAIR_MIN_M else 0


@njit(cache=CACHE)
def pass_rows(M):
    """How many of M activation rows the 4-row passes cover (0 below 4 rows). One or two rows past whole passes run
    one at a time over the group's weights, which the passes left in cache (M = 5: 4 + 1 rows' work, not the 8 of a
    second pass moved back to end at M); three run as that moved-back pass, which costs about as much."""
    r = M % 4
    return 0 if M < 4 else (M if r == 3 else M - r)  # 3 rows: see three_as_four


@njit(cache=CACHE)
def five_rows(M):
    """Whether a GEMV's last pass takes 5 activation rows (M = 5, 9, ...: a speculative check of 4 drafts): one
    more row in the pass that has the group's weights in registers costs less than a row alone over them after."""
    return M >= 5 and M % 4 == 1


@njit(cache=CACHE)
def three_as_four(x, out, pad):
    """(x, out) as a GEMV's passes take them: with pad, 3 activation rows become 4 (the third repeated) with an
    output of 4 rows, since one 4-row pass costs less than three rows alone where the passes read their weights in
    place; any other M as they are. rows_back copies the 3 rows into out afterwards."""
    if not pad or x.shape[0] != 3:
        return x, out
    xp = np.empty((4, x.shape[1]), np.float32)
    xp[:3] = x
    xp[3] = x[2]
    return xp, np.empty((4, out.shape[1]), np.float32)


@njit(cache=CACHE)
def rows_back(out, op):
    """out = op's first rows, where three_as_four gave op rows of its own."""
    if op.shape[0] != out.shape[0]:
        out[:] = op[:out.shape[0]]


@njit(cache=CACHE)
def unit_group(u, P):
    """The first group of work unit u (P pairs, then single groups)."""
    u = np.int64(u)  # a uint64 prange index mixed with int64 would type as float
    return 2 * u if u < P else u + P
