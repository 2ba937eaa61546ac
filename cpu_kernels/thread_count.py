"""Numba's thread count read and set from compiled code, in a form Numba can cache.

numba.get_num_threads / set_num_threads inside a jitted function call the threading layer through ctypes
pointers, which Numba refuses to cache ("dynamic globals"): a kernel using them would compile on every start.
These call the same C functions by the names Numba's threading layer registers with LLVM when it launches its
pool, so the cached machine code links to them by name. Call threads.num_threads() (which launches the pool)
before the first kernel that uses them runs.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I32 = ir.IntType(32)


@intrinsic
def set_threads(typingctx, n):
    """The calling thread's count for the parallel regions it launches next (numba.set_num_threads)."""
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [_I32]), "set_num_threads")
        builder.call(fn, [context.cast(builder, args[0], sig.args[0], types.int32)])
        return context.get_dummy_value()
    return types.none(n), codegen


@intrinsic
def get_threads(typingctx):
    """The calling thread's current count (numba.get_num_threads)."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, []), "get_num_threads")
        return context.cast(builder, builder.call(fn, []), types.int32, types.int64)
    return types.int64(), codegen
