"""32 bfloat16 lanes for Numba kernels: the long-prefill attention's score and weighted-sum products.

A bf16x32 value holds 16 pairs; _bdot(acc, a, b) adds a[2i] * b[2i] + a[2i+1] * b[2i+1] to lane i of a float32
x 16 accumulator: one AVX512-BF16 vdpbf16ps (32 products per instruction where vfmadd231ps does 16) on hosts
that have it (HAS_BF16_DOT), the same two exact products and two rounded adds in plain IR elsewhere. bf16 bits
travel as uint16 arrays; _bround and _bzip round float32 lanes to nearest even (vcvtne2ps2bf16, or integer
arithmetic with the same bits for normal numbers; the instruction flushes denormals to zero; these kernels see no
NaN or infinity). llvmlite has no bfloat type, so the dot product's operands are bitcast to one named here.
"""
from __future__ import annotations

import llvmlite.binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from cpu_kernels.vec16 import _VT, _f32x16, _shuf

HAS_BF16_DOT = bool(llvm_binding.get_host_cpu_features().get("avx512bf16", False))

_I16, _I32 = ir.IntType(16), ir.IntType(32)
_BT = ir.VectorType(_I16, 32)  # the Numba value: bf16 bits
_V16I = ir.VectorType(_I32, 16)


class _BFloat(ir.Type):
    def _to_string(self):
        return "bfloat"


_BF = ir.VectorType(_BFloat(), 32)


class _BF16x32(types.Type):
    def __init__(self):
        super().__init__(name="ramlm_bf16x32")


_bf16x32 = _BF16x32()


@register_model(_BF16x32)
class _BF16x32Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _BT)


def _ptr(context, builder, arrty, arr, idx, idxty, vt):
    a = context.make_array(arrty)(context, builder, arr)
    i = context.cast(builder, idx, idxty, types.intp)
    return builder.bitcast(builder.gep(a.data, [i]), vt.as_pointer())


def _u16_array(arr) -> bool:
    return isinstance(arr, types.Array) and arr.dtype == types.uint16


@intrinsic
def _bload(typingctx, arr, idx):
    """arr[idx:idx + 32] of a C-contiguous uint16 array of bf16 bits."""
    if not (_u16_array(arr) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _BT), align=2)
    return _bf16x32(arr, idx), codegen


@intrinsic
def _bstore(typingctx, arr, idx, v):
    """arr[idx:idx + 32] = v."""
    if not (_u16_array(arr) and isinstance(idx, types.Integer) and v == _bf16x32):
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _BT), align=2)
        return context.get_dummy_value()
    return types.none(arr, idx, v), codegen


@intrinsic
def _bsplat2(typingctx, arr, idx):
    """The pair arr[idx], arr[idx + 1] in all 16 pair slots."""
    if not (_u16_array(arr) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        pair = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _I32), align=2)
        v = builder.insert_element(ir.Constant(_V16I, ir.Undefined), pair, ir.Constant(_I32, 0))
        return builder.bitcast(builder.shuffle_vector(v, v, ir.Constant(_V16I, [0] * 16)), _BT)
    return _bf16x32(arr, idx), codegen


def _round16(builder, x):
    """float32 x 16 -> the bf16 bits, round to nearest even: (u + 0x7fff + (u >> 16 & 1)) >> 16."""
    u = builder.bitcast(x, _V16I)
    odd = builder.and_(builder.lshr(u, ir.Constant(_V16I, [16] * 16)), ir.Constant(_V16I, [1] * 16))
    r = builder.add(builder.add(u, ir.Constant(_V16I, [0x7FFF] * 16)), odd)
    return builder.trunc(builder.lshr(r, ir.Constant(_V16I, [16] * 16)), ir.VectorType(_I16, 16))


def _round32(builder, a, b, order):
    """Lanes a then b rounded to bf16, then permuted: lane i of the result is lane order[i] of the 32."""
    if HAS_BF16_DOT:  # one vcvtne2ps2bf16 (its second operand fills the low half) and at most one vpermw
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_BF, [_VT, _VT]),
                                            "llvm.x86.avx512bf16.cvtne2ps2bf16.512")
        both = builder.bitcast(builder.call(fn, [b, a]), _BT)
        return both if order == list(range(32)) else _shuf(builder, both, both, order)
    return _shuf(builder, _round16(builder, a), _round16(builder, b), order)


@intrinsic
def _bround(typingctx, a, b):
    """Lanes a then b (16 each) rounded to bf16."""
    if not (a == _f32x16 and b == _f32x16):
        return None

    def codegen(context, builder, sig, args):
        return _round32(builder, args[0], args[1], list(range(32)))
    return _bf16x32(a, b), codegen


@intrinsic
def _bzip(typingctx, a, b):
    """a[i], b[i] rounded to bf16 as pair i: two keys' values side by side, the layout _bdot multiplies by a
    _bsplat2 pair of weights."""
    if not (a == _f32x16 and b == _f32x16):
        return None

    def codegen(context, builder, sig, args):
        return _round32(builder, args[0], args[1], [i // 2 + 16 * (i % 2) for i in range(32)])
    return _bf16x32(a, b), codegen


def _widen(builder, x, odd):
    """The even (odd=0) or odd bf16 lanes of x as float32 x 16 (exact: bf16 is float32's upper half)."""
    half = builder.shuffle_vector(x, x, ir.Constant(_V16I, [2 * i + odd for i in range(16)]))
    return builder.bitcast(builder.shl(builder.zext(half, _V16I), ir.Constant(_V16I, [16] * 16)), _VT)


@intrinsic
def _bdot(typingctx, acc, a, b):
    """acc + a[2i + 1] * b[2i + 1] + a[2i] * b[2i] in lane i (vdpbf16ps's order; its products are exact)."""
    if not (acc == _f32x16 and a == _bf16x32 and b == _bf16x32):
        return None

    def codegen(context, builder, sig, args):
        vacc, va, vb = args
        if HAS_BF16_DOT:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VT, [_VT, _BF, _BF]),
                                                "llvm.x86.avx512bf16.dpbf16ps.512")
            return builder.call(fn, [vacc, builder.bitcast(va, _BF), builder.bitcast(vb, _BF)])
        hi = builder.fmul(_widen(builder, va, 1), _widen(builder, vb, 1))
        lo = builder.fmul(_widen(builder, va, 0), _widen(builder, vb, 0))
        return builder.fadd(builder.fadd(vacc, hi), lo)
    return _f32x16(acc, a, b), codegen
