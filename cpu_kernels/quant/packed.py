"""A weight's packed arrays as a named tuple of its format's own class, so that compiled code can run its
GEMV: gemv_packed(p, x, out) picks the format's kernel from p's type when it compiles (the fused decode
block, cpu_kernels/decode_block.py, calls every weight of a layer this way whatever their formats)."""
from __future__ import annotations

from collections import namedtuple

from numba.extending import overload

from .registry import FORMATS

# One class per format, importable from here by name (Numba's cache pickles the types by reference).
PACKED = {}
for _t, _f in FORMATS.items():
    _cls = namedtuple(f"Packed{_t.name}", _f.fields)
    _cls.__module__ = __name__
    globals()[_cls.__name__] = _cls
    PACKED[_t] = _cls
_GEMV_OF = {PACKED[t]: f.gemv for t, f in FORMATS.items()}


def packed(weight):
    """weight (a QuantLinear)'s packed arrays as its format's named tuple."""
    return PACKED[weight.ggml_type](*weight.packed)


def gemv_packed(p, x, out):
    """out = x @ W^T for W's packed arrays p (packed()): the format's own GEMV."""
    return _GEMV_OF[type(p)](*p, x, out)


@overload(gemv_packed)
def _gemv_packed(p, x, out):
    kernel = _GEMV_OF.get(getattr(p, "instance_class", None))
    if kernel is None:
        return None
    n = len(p)  # star-arguments of a tuple do not compile: one spelled-out call per field count
    if n == 1:
        return lambda p, x, out: kernel(p[0], x, out)
    if n == 2:
        return lambda p, x, out: kernel(p[0], p[1], x, out)
    if n == 3:
        return lambda p, x, out: kernel(p[0], p[1], p[2], x, out)
    if n == 4:
        return lambda p, x, out: kernel(p[0], p[1], p[2], p[3], x, out)
    if n == 5:
        return lambda p, x, out: kernel(p[0], p[1], p[2], p[3], p[4], x, out)
    if n == 6:
        return lambda p, x, out: kernel(p[0], p[1], p[2], p[3], p[4], p[5], x, out)
    return None


def packed_slice(p, e):
    """Expert e's weight from a packed named tuple whose arrays carry a leading expert axis (stacked experts)."""
    return type(p)(*(a[e] for a in p))


@overload(packed_slice)
def _packed_slice(p, e):
    cls = getattr(p, "instance_class", None)
    if cls not in _GEMV_OF:
        return None
    n = len(p)  # one spelled-out constructor call per field count, as gemv_packed
    if n == 1:
        return lambda p, e: cls(p[0][e])
    if n == 2:
        return lambda p, e: cls(p[0][e], p[1][e])
    if n == 3:
        return lambda p, e: cls(p[0][e], p[1][e], p[2][e])
    if n == 4:
        return lambda p, e: cls(p[0][e], p[1][e], p[2][e], p[3][e])
    if n == 5:
        return lambda p, e: cls(p[0][e], p[1][e], p[2][e], p[3][e], p[4][e])
    if n == 6:
        return lambda p, e: cls(p[0][e], p[1][e], p[2][e], p[3][e], p[4][e], p[5][e])
    return None
