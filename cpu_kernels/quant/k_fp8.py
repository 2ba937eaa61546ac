"""FP8_E4M3 (qtypes.RamlmType): float8 e4m3fn weights with a float32 scale per 128 values of a row.

Layout after repack.fp8: q uint8 (N, K) the e4m3 bytes, d float32 (N, K / 128) the scales times 256. An e4m3 byte
becomes float16 bits with two shifts (the same sign, exponent and mantissa fields, the exponent bias 15 in place of
7: the value / 256, subnormals included), then float32 lanes (vcvtph2ps); the 256 lives in d. Activations stay
float32 (no int8 rounding): value = e4m3 * scale exactly as the checkpoint defines it.
gemv_fp8: per row and 128-block, two 4-vector chains summed, then tot += block * d (one rounding order whatever M).
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .simd import CACHE, PREFETCH_AHEAD, _ptr, _splat, f32x16, hsum, load_f32x16, muladd, prefetch, store, vadd, \
    vmul, zero_f32x16

_I16x16 = ir.VectorType(ir.IntType(16), 16)


@intrinsic
def load_e4m3x16(typingctx, arr, idx):
    """16 e4m3 bytes of a uint8 array from element idx -> f32x16 of their values / 256."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint8 and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        p = _ptr(context, builder, sig.args[0], args[0], i, ir.VectorType(ir.IntType(8), 16))
        w = builder.zext(builder.load(p, align=1), _I16x16)
        c = lambda v: _splat(builder, ir.Constant(ir.IntType(16), v), 16)  # noqa: E731
        mag = builder.shl(builder.and_(w, c(0x7F)), c(7))
        sign = builder.shl(builder.and_(w, c(0x80)), c(8))
        h = builder.bitcast(builder.or_(mag, sign), ir.VectorType(ir.HalfType(), 16))
        return builder.fpext(h, ir.VectorType(ir.FloatType(), 16))
    return f32x16(arr, idx), codegen


@njit(cache=CACHE, inline="always")
def _block(q, o, x, xo):
    """sum over one 128-value block of w * x, as f32x16 lanes (two chains of four)."""
    a = vmul(load_e4m3x16(q, o), load_f32x16(x, xo))
    c = vmul(load_e4m3x16(q, o + 64), load_f32x16(x, xo + 64))
    for j in range(1, 4):
        a = muladd(a, load_e4m3x16(q, o + 16 * j), load_f32x16(x, xo + 16 * j))
        c = muladd(c, load_e4m3x16(q, o + 64 + 16 * j), load_f32x16(x, xo + 64 + 16 * j))
    return vadd(a, c)


@njit(parallel=True, cache=CACHE)
def gemv_fp8(q, d, x, out):
    M, K = x.shape
    N = q.shape[0]
    nb = K // 128
    for n in prange(N):
        if M < 4:
            for m in range(M):
                tot = zero_f32x16()
                for b in range(nb):
                    if m == 0:
                        prefetch(q, n * K + b * 128 + PREFETCH_AHEAD)
                        prefetch(q, n * K + b * 128 + PREFETCH_AHEAD + 64)
                    tot = muladd(tot, _block(q, n * K + b * 128, x, m * K + b * 128), d[n, b])
                out[m, n] = hsum(tot)
            continue
        for m in range(0, M, 4):  # 4 activation rows per pass; the last pass ends at M (overlap recomputed, equal)
            m0 = min(m, M - 4)
            t0, t1, t2, t3 = zero_f32x16(), zero_f32x16(), zero_f32x16(), zero_f32x16()
            for b in range(nb):
                o = n * K + b * 128
                if m == 0:
                    prefetch(q, o + PREFETCH_AHEAD)
                    prefetch(q, o + PREFETCH_AHEAD + 64)
                db = d[n, b]
                t0 = muladd(t0, _block(q, o, x, m0 * K + b * 128), db)
                t1 = muladd(t1, _block(q, o, x, (m0 + 1) * K + b * 128), db)
                t2 = muladd(t2, _block(q, o, x, (m0 + 2) * K + b * 128), db)
                t3 = muladd(t3, _block(q, o, x, (m0 + 3) * K + b * 128), db)
            out[m0, n] = hsum(t0)
            out[m0 + 1, n] = hsum(t1)
            out[m0 + 2, n] = hsum(t2)
            out[m0 + 3, n] = hsum(t3)


@njit(parallel=True, cache=CACHE)
def deq_fp8(q, d, rows, out):
    K = out.shape[1]
    for t in prange(rows.shape[0]):
        r = rows[t]
        for b in range(K // 128):
            for j in range(8):
                store(out, t * K + b * 128 + 16 * j, vmul(load_e4m3x16(q, r * K + b * 128 + 16 * j), d[r, b]))
