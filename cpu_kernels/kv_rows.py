"""One cached row (a token's head_dim values for one kv head) into and out of every KV cache storage: the element
formats (float16 bits, float32, fp8 bytes) value by value through f16.py, and int8 KV (kv_cache_dtype int8, llama.cpp's
q8_0 cache) as llama.cpp's q8_0 blocks: a row is (head_dim / 32, 34) bytes, each block an f16 scale d = amax / 127
(little-endian) then 32 int8 round(x / d), the bytes gguf's Q8_0 quantizer writes. The storages are told apart by
their Numba types: a q8_0 cache has one more axis (5-D; its row is 2-D), so the kernels stay one code for all."""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from cpu_kernels.f16 import _encode, _load_f32, f16_to_f32, f32_to_f16
from cpu_kernels.quant.quantize_fast import _roundf
from cpu_kernels.vec16 import _f32x16, _vmul, _vstore

_JIT = dict(cache=True, error_model="numpy")
Q8 = 32  # values per q8_0 block (engine/core/kv_spec.Q8_BLOCK)
STORAGES = ("float16", "float32", "uint8", "int8", "q8_0")  # engine/core/kv_spec.py's storage names


def zeros_cache(num_blocks: int, block_size: int, num_heads: int, head_dim: int, storage: str) -> np.ndarray:
    """A zeroed cache of a storage (kv_spec's LayerKV.block_shape, for the kernels' own warm-ups and tests)."""
    if storage == "q8_0":
        return np.zeros((num_blocks, block_size, num_heads, head_dim // Q8, Q8 + 2), np.uint8)
    return np.zeros((num_blocks, block_size, num_heads, head_dim), storage)


def head_dim(cache):
    """The values per row of a cache (num_blocks, block_size, Hkv, D) or q8_0's (..., D / 32, 34) (Python and
    Numba alike)."""
    return cache.shape[3] * Q8 if cache.ndim == 5 else cache.shape[3]


@overload(head_dim)
def _head_dim_impl(cache):
    if cache.ndim == 5:
        return lambda cache: cache.shape[3] * Q8
    return lambda cache: cache.shape[3]


def store_row(src, dst):
    """f32 src (D,) -> a cache row dst (cache[blk, off, h])."""


def load_row(src, dst):
    """A cache row src -> f32 dst (D,)."""


@njit(**_JIT)
def _store_q8(src, dst):
    n = dst.shape[1] - 2  # 32, read from the array: a trip count LLVM does not know keeps the loops vectorized
    for b in range(dst.shape[0]):
        x = src[n * b:n * b + n]
        amax = np.float32(0.0)
        for i in range(n):
            amax = max(amax, abs(x[i]))
        d = amax / np.float32(127.0)
        inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        blk = dst[b]
        bits = f32_to_f16(d)
        blk[0], blk[1] = np.uint8(bits & 0xFF), np.uint8(bits >> 8)
        q = blk[2:]
        for i in range(n):
            q[i] = np.uint8(np.int8(_roundf(x[i] * inv)))


@intrinsic
def _i8x16(typingctx, row, b, i):
    """Bytes i..i+15 of block b of a q8_0 row (C-contiguous uint8 (nblocks, 34)) as int8, widened to 16 float32
    lanes (vpmovsxbd + vcvtdq2ps)."""
    if not (isinstance(row, types.Array) and row.ndim == 2 and row.layout == "C" and row.dtype == types.uint8):
        return None

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        blk = context.cast(builder, args[1], sig.args[1], types.intp)
        off = context.cast(builder, args[2], sig.args[2], types.intp)
        at = builder.add(builder.mul(blk, ir.Constant(blk.type, 34)), off)
        ptr = builder.bitcast(builder.gep(a.data, [at]), ir.VectorType(ir.IntType(8), 16).as_pointer())
        return builder.sitofp(builder.sext(builder.load(ptr, align=1), ir.VectorType(ir.IntType(32), 16)),
                              ir.VectorType(ir.FloatType(), 16))
    return _f32x16(row, b, i), codegen


@intrinsic
def _fp8x16(typingctx, row, i):
    """Bytes i..i+15 of an fp8 row (uint8: e4m3fn, int8: e5m2) as 16 float32 lanes, f16.py's conversions on a
    vector: e4m3fn's byte sign-extended, shifted left by 7 and masked to 0xBF80 is float16 bits of the value / 256;
    e5m2's byte is a float16's top byte. Exact (fpext of a half)."""
    if not (isinstance(row, types.Array) and row.ndim == 1 and row.layout == "C"
            and row.dtype in (types.uint8, types.int8)):
        return None
    e4m3 = row.dtype == types.uint8

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        at = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(a.data, [at]), ir.VectorType(ir.IntType(8), 16).as_pointer())
        b, i16 = builder.load(ptr, align=1), ir.VectorType(ir.IntType(16), 16)
        if e4m3:
            w = builder.and_(builder.shl(builder.sext(b, i16), ir.Constant(i16, [7] * 16)),
                             ir.Constant(i16, [0xBF80] * 16))
        else:
            w = builder.shl(builder.zext(b, i16), ir.Constant(i16, [8] * 16))
        f = builder.fpext(builder.bitcast(w, ir.VectorType(ir.HalfType(), 16)), ir.VectorType(ir.FloatType(), 16))
        return builder.fmul(f, ir.Constant(f.type, [256.0 if e4m3 else 1.0] * 16)) if e4m3 else f
    return _f32x16(row, i), codegen


@njit(**_JIT)
def _load_fp8(src, dst):
    D = src.shape[0]
    i = 0
    while i + 16 <= D:
        _vstore(dst, i, _fp8x16(src, i))
        i += 16
    for d in range(i, D):
        dst[d] = _load_f32(src[d])


@intrinsic
def _q8_scale(typingctx, row, b):
    """Block b's f16 scale of a q8_0 row (C-contiguous uint8 (nblocks, 34)) as float32: one 16-bit load, fpext."""
    if not (isinstance(row, types.Array) and row.ndim == 2 and row.layout == "C" and row.dtype == types.uint8):
        return None

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        blk = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(a.data, [builder.mul(blk, ir.Constant(blk.type, 34))]),
                              ir.HalfType().as_pointer())
        return builder.fpext(builder.load(ptr, align=1), ir.FloatType())
    return types.float32(row, b), codegen


@njit(**_JIT)
def _load_q8(src, dst):
    for b in range(src.shape[0]):
        d = _q8_scale(src, b)
        _vstore(dst, Q8 * b, _vmul(_i8x16(src, b, 2), d))
        _vstore(dst, Q8 * b + 16, _vmul(_i8x16(src, b, 18), d))


@overload(store_row, inline="always")
def _store_row_impl(src, dst):
    if dst.ndim == 2:
        return lambda src, dst: _store_q8(src, dst)

    def store(src, dst):  # indices from range(D) need no wraparound checks, so the conversion vectorizes
        for d in range(src.shape[0]):
            dst[d] = _encode(src[d], dst)
    return store


@overload(load_row, inline="always")
def _load_row_impl(src, dst):
    if isinstance(src, types.Array) and src.ndim == 2:
        return lambda src, dst: _load_q8(src, dst)
    if isinstance(src, types.Array) and src.dtype in (types.uint8, types.int8):
        return lambda src, dst: _load_fp8(src, dst)

    def load(src, dst):
        for d in range(src.shape[0]):
            dst[d] = _load_f32(src[d])
    return load


@njit(**_JIT)
def store_rows(x, out):
    """Test helper: store_row of each row of f32 x (R, D) into out (R, *row axes)."""
    for r in range(x.shape[0]):
        store_row(x[r], out[r])


@njit(**_JIT)
def load_rows(rows, out):
    """Test helper: load_row of each cached row into f32 out (R, D)."""
    for r in range(rows.shape[0]):
        load_row(rows[r], out[r])
