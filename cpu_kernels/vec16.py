"""16-lane float32 vectors for Numba kernels (paged attention's score and weighted-sum micro-kernels)."""
from __future__ import annotations

import platform

import llvmlite.binding as llvm_binding
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model


# Explicit vectors fix each score's arithmetic by construction: lane-wise fma(q, k, acc) over the 16-wide
# chunks of D, then one fixed halving tree. There are no fast-math flags, so LLVM may not reorder, and a
# score or an output row is bitwise the same whichever kernel variant (1 or 4 query vectors) or tile
# computes it. Rows are zero-padded to Dp (a multiple of 32); padded lanes add exact zeros.
_VT = ir.VectorType(ir.FloatType(), 16)
_I32 = ir.IntType(32)


class _F32x16(types.Type):
    def __init__(self):
        super().__init__(name="ramlm_attention_f32x16")


_f32x16 = _F32x16()


@register_model(_F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VT)


def _vptr(context, builder, arrty, arr, idx, idxty):
    a = context.make_array(arrty)(context, builder, arr)
    i = context.cast(builder, idx, idxty, types.intp)
    return builder.bitcast(builder.gep(a.data, [i]), _VT.as_pointer())


@intrinsic
def _vload(typingctx, arr, idx):
    """arr[idx:idx + 16] of a C-contiguous float32 array (idx counts elements)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_vptr(context, builder, sig.args[0], args[0], args[1], sig.args[1]), align=4)
    return _f32x16(arr, idx), codegen


@intrinsic
def _vstore(typingctx, arr, idx, v):
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and v == _f32x16):
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _vptr(context, builder, sig.args[0], args[0], args[1], sig.args[1]), align=4)
        return context.get_dummy_value()
    return types.none(arr, idx, v), codegen


@intrinsic
def _vzero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VT, None)
    return _f32x16(), codegen


def _shuf(builder, a, b, idx):
    """Lanes idx of a and b side by side (LLVM's shufflevector with a constant mask)."""
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _has_fma() -> bool:
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        return bool(llvm_binding.get_host_cpu_features().get("fma", False))
    return True  # aarch64 has fused multiply-add


_FUSED = _has_fma()


@intrinsic
def _vmuladd(typingctx, acc, a, b):
    """acc + a * b on 16 lanes; b a vector or a float (broadcast). One fused rounding (llvm.fma) where the
    CPU has FMA, else a rounded multiply then a rounded add: fixed arithmetic either way."""
    if not (acc == _f32x16 and a == _f32x16 and (b == _f32x16 or isinstance(b, types.Float))):
        return None

    def codegen(context, builder, sig, args):
        vacc, va = args[0], args[1]
        vb = _vec_or_splat(context, builder, sig.args[2], args[2])
        if _FUSED:
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VT, [_VT, _VT, _VT]),
                                                 "llvm.fma.v16f32")
            return builder.call(fma, [va, vb, vacc])
        return builder.fadd(vacc, builder.fmul(va, vb))
    return _f32x16(acc, a, b), codegen


@intrinsic
def _vhsum(typingctx, v):
    """Sum of the 16 lanes: high half added to low half until one lane is left."""
    if v != _f32x16:
        return None

    def codegen(context, builder, sig, args):
        return _halving(builder, args[0], builder.fadd)
    return types.float32(v), codegen


def _halving(builder, x, op):
    """op over the 16 lanes of x: the high half combined with the low half until one lane is left."""
    n = 16
    while n > 1:
        h = n // 2
        x, n = op(_shuf(builder, x, x, list(range(h))), _shuf(builder, x, x, list(range(h, n)))), h
    return builder.extract_element(x, ir.Constant(_I32, 0))


@intrinsic
def _vhsum4_store(typingctx, a, b, c, d, arr, idx):
    """arr[idx:idx + 4] = the lane sums of a, b, c, d: _vhsum's halving tree for each (the same bits), run on the
    four at once (13 vector operations, not 4 x 8, and one store; a 4 x 4 score tile ends in four of these)."""
    if not (a == b == c == d == _f32x16 and isinstance(arr, types.Array) and arr.dtype == types.float32
            and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        lo8, hi8 = list(range(8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32))
        ab = builder.fadd(_shuf(builder, args[0], args[1], lo8), _shuf(builder, args[0], args[1], hi8))
        cd = builder.fadd(_shuf(builder, args[2], args[3], lo8), _shuf(builder, args[2], args[3], hi8))
        # four lanes per vector from here: the low four plus the high four, then pairs, then the two left
        x = builder.fadd(_shuf(builder, ab, cd, [8 * g + i for g in range(4) for i in range(4)]),
                         _shuf(builder, ab, cd, [8 * g + 4 + i for g in range(4) for i in range(4)]))
        x = builder.fadd(x, _shuf(builder, x, x, [i // 4 * 4 + (i + 2) % 4 for i in range(16)]))
        x = builder.fadd(x, _shuf(builder, x, x, [i // 4 * 4 + (i + 1) % 4 for i in range(16)]))
        a = context.make_array(sig.args[4])(context, builder, args[4])
        i = context.cast(builder, args[5], sig.args[5], types.intp)
        ptr = builder.bitcast(builder.gep(a.data, [i]), ir.VectorType(ir.FloatType(), 4).as_pointer())
        builder.store(_shuf(builder, x, x, [0, 4, 8, 12]), ptr, align=4)
        return context.get_dummy_value()
    return types.none(a, b, c, d, arr, idx), codegen


def _splat_f(builder, s):
    v = builder.insert_element(ir.Constant(_VT, ir.Undefined), s, ir.Constant(_I32, 0))
    return _shuf(builder, v, v, [0] * 16)


@intrinsic
def _vadd(typingctx, a, b):
    if not (a == _f32x16 and b == _f32x16):
        return None

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return _f32x16(a, b), codegen


def _max(builder, a, b):
    return builder.select(builder.fcmp_ordered(">", a, b), a, b)


@intrinsic
def _vmax(typingctx, a, b):
    """Lane-wise max (a > b ? a : b): exact, so any order of a reduction gives the same result."""
    if not (a == _f32x16 and b == _f32x16):
        return None

    def codegen(context, builder, sig, args):
        return _max(builder, args[0], args[1])
    return _f32x16(a, b), codegen


@intrinsic
def _vhmax(typingctx, v):
    """Max of the 16 lanes (halving tree)."""
    if v != _f32x16:
        return None

    def codegen(context, builder, sig, args):
        return _halving(builder, args[0], lambda a, b: _max(builder, a, b))
    return types.float32(v), codegen


@intrinsic
def _vmask(typingctx, v, base, lo, hi, fill):
    """Lane i of v where lo <= base + i < hi, else fill (a float)."""
    if not (v == _f32x16 and all(isinstance(t, types.Integer) for t in (base, lo, hi))
            and isinstance(fill, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        vi = ir.VectorType(_I32, 16)
        b, l, h = (context.cast(builder, a, t, types.int32) for a, t in zip(args[1:4], sig.args[1:4]))
        splat = lambda s: builder.shuffle_vector(builder.insert_element(ir.Constant(vi, ir.Undefined), s,
                                                                         ir.Constant(_I32, 0)),
                                                 ir.Constant(vi, ir.Undefined), ir.Constant(vi, [0] * 16))
        idx = builder.add(splat(b), ir.Constant(vi, list(range(16))))
        keep = builder.and_(builder.icmp_signed(">=", idx, splat(l)), builder.icmp_signed("<", idx, splat(h)))
        f = _splat_f(builder, context.cast(builder, args[4], sig.args[4], types.float32))
        return builder.select(keep, args[0], f)
    return _f32x16(v, base, lo, hi, fill), codegen


def _vec_or_splat(context, builder, ty, val):
    """val as 16 lanes: itself if a vector, else the float broadcast."""
    return val if ty == _f32x16 else _splat_f(builder, context.cast(builder, val, ty, types.float32))


def _lanewise(op: str, doc: str):
    """An intrinsic a op b on 16 lanes; b a vector or a float (broadcast)."""
    def typer(typingctx, a, b):
        if not (a == _f32x16 and (b == _f32x16 or isinstance(b, types.Float))):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], _vec_or_splat(context, builder, sig.args[1], args[1]))
        return _f32x16(a, b), codegen
    typer.__doc__ = doc
    return intrinsic(typer)


_vsub = _lanewise("fsub", "a - b on 16 lanes; b a vector or a float (broadcast).")
_vmul = _lanewise("fmul", "a * b on 16 lanes; b a vector or a float (broadcast).")


@intrinsic
def _vexp(typingctx, v):
    """activations.exp_f32 on 16 lanes: the same float32 operations in the same order, so each lane has the
    scalar's bits (LLVM left the scalar loop over a block's 16 keys unvectorized: ~40 % of a prefill's attention)."""
    if v != _f32x16:
        return None

    def codegen(context, builder, sig, args):
        from cpu_kernels import activations as a
        c = lambda f: _splat_f(builder, ir.Constant(ir.FloatType(), float(f)))
        vi = ir.VectorType(_I32, 16)
        x = args[0]
        x = builder.select(builder.fcmp_ordered("<", x, c(a._EXP_MIN)), c(a._EXP_MIN), x)
        x = builder.select(builder.fcmp_ordered(">", x, c(a._EXP_MAX)), c(a._EXP_MAX), x)
        floor = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VT, [_VT]), "llvm.floor.v16f32")
        n = builder.call(floor, [builder.fadd(builder.fmul(x, c(a._LOG2E)), c(a._HALF))])
        r = builder.fsub(x, builder.fmul(n, c(a._LN2_HI)))
        r = builder.fsub(r, builder.fmul(n, c(a._LN2_LO)))
        p = builder.fadd(builder.fmul(c(a._P0), r), c(a._P1))
        for k in (a._P2, a._P3, a._P4, a._P5):
            p = builder.fadd(builder.fmul(p, r), c(k))
        p = builder.fadd(builder.fadd(builder.fmul(p, builder.fmul(r, r)), r), c(a._F1))
        e = builder.shl(builder.add(builder.fptosi(n, vi), ir.Constant(vi, [127] * 16)), ir.Constant(vi, [23] * 16))
        return builder.fmul(p, builder.bitcast(e, _VT))
    return _f32x16(v), codegen


@njit(cache=True, inline="always")
def _vload_rows4x2(arr, a0, Dp, c):
    """The 32 lanes at column c of four rows Dp apart from a0: (row 0's two halves, row 1's, row 2's, row 3's)."""
    return (_vload(arr, a0 + c), _vload(arr, a0 + c + 16), _vload(arr, a0 + Dp + c), _vload(arr, a0 + Dp + c + 16),
            _vload(arr, a0 + 2 * Dp + c), _vload(arr, a0 + 2 * Dp + c + 16), _vload(arr, a0 + 3 * Dp + c),
            _vload(arr, a0 + 3 * Dp + c + 16))


@njit(cache=True, inline="always")
def _vstore_rows4x2(arr, a0, Dp, c, x00, x01, x10, x11, x20, x21, x30, x31):
    """_vload_rows4x2's lanes written back."""
    _vstore(arr, a0 + c, x00)
    _vstore(arr, a0 + c + 16, x01)
    _vstore(arr, a0 + Dp + c, x10)
    _vstore(arr, a0 + Dp + c + 16, x11)
    _vstore(arr, a0 + 2 * Dp + c, x20)
    _vstore(arr, a0 + 2 * Dp + c + 16, x21)
    _vstore(arr, a0 + 3 * Dp + c, x30)
    _vstore(arr, a0 + 3 * Dp + c + 16, x31)
