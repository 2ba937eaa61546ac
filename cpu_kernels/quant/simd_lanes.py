"""Lane shuffles and strided or broadcast loads for simd.py's vectors: one scale per lane group, bytes of
interleaved rows, scalars splat or taken out of a lane."""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .simd import Vec, _I32, _ptr, _splat, f32x8


@intrinsic
def lanes2(typingctx, v, k):
    """f32x8 [v[2k] x 4, v[2k+1] x 4] (k constant after unrolling): scales of two 16-element halves."""
    if not (v == f32x8 and isinstance(k, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        kk = context.cast(builder, args[1], sig.args[1], types.int32)
        two = ir.Constant(_I32, 2)
        a = builder.extract_element(args[0], builder.mul(kk, two))
        b = builder.extract_element(args[0], builder.add(builder.mul(kk, two), ir.Constant(_I32, 1)))
        w = ir.Constant(ir.VectorType(ir.FloatType(), 2), ir.Undefined)
        w = builder.insert_element(builder.insert_element(w, a, ir.Constant(_I32, 0)), b, ir.Constant(_I32, 1))
        return builder.shuffle_vector(w, w, ir.Constant(ir.VectorType(_I32, 8), [0, 0, 0, 0, 1, 1, 1, 1]))
    return f32x8(v, k), codegen


@intrinsic
def load_dup2(typingctx, arr, idx):
    """f32x8 [a0, a0, a1, a1, a2, a2, a3, a3] from 4 float32 at arr.flat[idx]."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        p = _ptr(context, builder, sig.args[0], args[0], i, ir.VectorType(ir.FloatType(), 4))
        w = builder.load(p, align=1)
        return builder.shuffle_vector(w, w, ir.Constant(ir.VectorType(_I32, 8), [0, 0, 1, 1, 2, 2, 3, 3]))
    return f32x8(arr, idx), codegen


@intrinsic
def pair16(typingctx, a, b):
    """f32x32 [a x 16, b x 16] from two scalars: per-element scales of two 16-element sub-blocks."""
    if not (isinstance(a, types.Float) and isinstance(b, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        fa = context.cast(builder, args[0], sig.args[0], types.float32)
        fb = context.cast(builder, args[1], sig.args[1], types.float32)
        v = ir.Constant(ir.VectorType(ir.FloatType(), 2), ir.Undefined)
        v = builder.insert_element(builder.insert_element(v, fa, ir.Constant(_I32, 0)), fb, ir.Constant(_I32, 1))
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 32), [0] * 16 + [1] * 16))
    return Vec("f32", 32)(a, b), codegen


def _make_load_bcast4(words: int):
    @intrinsic
    def load(typingctx, arr, idx):
        if not (isinstance(arr, types.Array) and arr.dtype in (types.uint8, types.int8)
                and isinstance(idx, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            i = context.cast(builder, args[1], sig.args[1], types.intp)
            word = builder.load(_ptr(context, builder, sig.args[0], args[0], i, _I32), align=1)
            return builder.bitcast(_splat(builder, word, words), ir.VectorType(ir.IntType(8), 4 * words))
        return Vec("i8", 4 * words)(arr, idx), codegen
    return load


# u8x32 holding the 4 bytes at arr.flat[idx] in each of its 8 dword lanes (a vpdpbusd memory broadcast): one
# activation quad against the same quad of 8 interleaved weight rows.
load_bcast4 = _make_load_bcast4(8)


def _make_load_strided(words: int):
    @intrinsic
    def load(typingctx, arr, idx, stride):
        if not (isinstance(arr, types.Array) and arr.dtype in (types.uint8, types.int8)
                and isinstance(idx, types.Integer) and isinstance(stride, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            i = context.cast(builder, args[1], sig.args[1], types.intp)
            s = context.cast(builder, args[2], sig.args[2], types.intp)
            v = ir.Constant(ir.VectorType(_I32, words), ir.Undefined)
            for j in range(words):
                off = builder.add(i, builder.mul(s, ir.Constant(s.type, j)))
                word = builder.load(_ptr(context, builder, sig.args[0], args[0], off, _I32), align=1)
                v = builder.insert_element(v, word, ir.Constant(_I32, j))
            return builder.bitcast(v, ir.VectorType(ir.IntType(8), 4 * words))
        return Vec("i8", 4 * words)(arr, idx, stride), codegen
    return load


# load_strided4 / load_strided4x4: 8 / 4 groups of 4 bytes at arr.flat[idx + j * stride] as one u8x32 / u8x16:
# one row's values out of an 8-row interleaved block.
load_strided4 = _make_load_strided(8)
load_strided4x4 = _make_load_strided(4)


def _make_splat_i32(n: int):
    @intrinsic
    def splat(typingctx, s):
        """An i32 vector of n lanes, every lane s."""
        if not isinstance(s, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            return _splat(builder, context.cast(builder, args[0], sig.args[0], types.int32), n)
        return Vec("i32", n)(s), codegen
    return splat


splat_i32 = _make_splat_i32(8)  # i32x8 with every lane s


@intrinsic
def lane(typingctx, v, j):
    """Lane j of v as a scalar."""
    if not (isinstance(v, Vec) and isinstance(j, types.Integer)):
        return None
    rt = {"f32": types.float32, "i32": types.int32, "i16": types.int16}.get(v.kind, types.uint8)

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1], types.int32))
    return rt(v, j), codegen
