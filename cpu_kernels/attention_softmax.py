"""The online softmax of paged attention's tiles: one block of keys' scores -> weights, folded into each query
vector's running max and sum (attention._tile_block calls it per block).

Whole 16-lane chunks of a row (explicit vectors: scalar loops over a block's <= 16 keys stayed scalar, LLVM
vectorizing only whole multiples of its wider step), keys outside a row's range get exactly 0, and a fixed
halving tree sums each chunk, so a query vector gets the same bits in any tile and either variant.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.activations import exp_f32, tanh_f32
from cpu_kernels.vec16 import _vadd, _vexp, _vhmax, _vhsum, _vload, _vmask, _vmax, _vmul, _vstore, _vsub, _vzero

_JIT = dict(cache=True, error_model="numpy")
_F0 = np.float32(0.0)
_NEG_INF = np.float32(-np.inf)


@njit(**_JIT)
def block_weights(sc, v, n, ja, jb, scale, softcap, m, l, acc):
    """Query vector v's scores sc[v, :n] of one block -> softmax weights: keys ja..jb-1 are the row's, the rest
    get exactly 0; the block is folded into the running max m[v] and sum l[v] (acc[v] rescaled when m grows)."""
    W = sc.shape[1]
    # W is a multiple of 16; lanes past n are finite leftovers, masked off
    srow = sc[v]
    if jb <= ja:  # no key of this block for this row
        for jj in range(n):
            srow[jj] = _F0
        return
    if softcap > _F0:
        for jj in range(n):
            srow[jj] = softcap * tanh_f32(srow[jj] * scale / softcap)
    else:
        for c in range(0, n, 16):
            _vstore(sc, v * W + c, _vmul(_vload(sc, v * W + c), scale))
    mxv = _vmask(_vload(sc, v * W), 0, ja, jb, _NEG_INF)  # keys outside ja..jb masked
    for c in range(16, n, 16):
        mxv = _vmax(mxv, _vmask(_vload(sc, v * W + c), c, ja, jb, _NEG_INF))
    mx = max(m[v], _vhmax(mxv))
    _rescale(v, mx, m, l, acc)
    sv = _vzero()
    for c in range(0, n, 16):  # weights outside ja..jb exactly 0; a fixed tree sums each chunk
        e = _vmask(_vexp(_vsub(_vload(sc, v * W + c), mx)), c, ja, jb, _F0)
        _vstore(sc, v * W + c, e)
        sv = _vadd(sv, e)
    l[v] += _vhsum(sv)


@njit(**_JIT)
def _rescale(v, mx, m, l, acc):
    """Running max of query vector v -> mx: what is accumulated is rescaled when the max grows."""
    if mx > m[v] and m[v] > _NEG_INF:
        alpha = exp_f32(m[v] - mx)
        l[v] *= alpha
        arow = acc[v]
        for d in range(acc.shape[1]):
            arow[d] *= alpha
    m[v] = mx


@njit(**_JIT)
def block_weights4(sc, v, n, ja, jb, scale, softcap, m, l, acc):
    """block_weights for query vectors v..v+3 of one row (the same keys ja..jb): the same operations in four
    independent chains side by side (one vector's max -> exp -> sum chain of latencies left the core idle; this is
    the common case: a block of at most 16 keys, no softcap). A vector gets the bits block_weights gives it."""
    if jb <= ja or softcap > _F0 or n > 16:
        for i in range(4):
            block_weights(sc, v + i, n, ja, jb, scale, softcap, m, l, acc)
        return
    W = sc.shape[1]
    x0, x1 = _vmul(_vload(sc, v * W), scale), _vmul(_vload(sc, (v + 1) * W), scale)
    x2, x3 = _vmul(_vload(sc, (v + 2) * W), scale), _vmul(_vload(sc, (v + 3) * W), scale)
    mx0 = max(m[v], _vhmax(_vmask(x0, 0, ja, jb, _NEG_INF)))
    mx1 = max(m[v + 1], _vhmax(_vmask(x1, 0, ja, jb, _NEG_INF)))
    mx2 = max(m[v + 2], _vhmax(_vmask(x2, 0, ja, jb, _NEG_INF)))
    mx3 = max(m[v + 3], _vhmax(_vmask(x3, 0, ja, jb, _NEG_INF)))
    _rescale(v, mx0, m, l, acc)
    _rescale(v + 1, mx1, m, l, acc)
    _rescale(v + 2, mx2, m, l, acc)
    _rescale(v + 3, mx3, m, l, acc)
    e0 = _vmask(_vexp(_vsub(x0, mx0)), 0, ja, jb, _F0)
    e1 = _vmask(_vexp(_vsub(x1, mx1)), 0, ja, jb, _F0)
    e2 = _vmask(_vexp(_vsub(x2, mx2)), 0, ja, jb, _F0)
    e3 = _vmask(_vexp(_vsub(x3, mx3)), 0, ja, jb, _F0)
    _vstore(sc, v * W, e0)
    _vstore(sc, (v + 1) * W, e1)
    _vstore(sc, (v + 2) * W, e2)
    _vstore(sc, (v + 3) * W, e3)
    l[v] += _vhsum(_vadd(_vzero(), e0))  # block_weights' running vector sum from zero, one chunk
    l[v + 1] += _vhsum(_vadd(_vzero(), e1))
    l[v + 2] += _vhsum(_vadd(_vzero(), e2))
    l[v + 3] += _vhsum(_vadd(_vzero(), e3))
