"""The products of paged attention's tiles (attention._tile_block): each block's scores q . k and the weighted sum of
its values, in float32 explicit 16-lane vector kernels four query vectors at a time, or from bf16 roundings
(attention_bf16). The arithmetic per (query vector, key) is fixed, so a row gets the same bits in any tile."""
from __future__ import annotations

from numba import njit

from cpu_kernels import attention_bf16 as B16
from cpu_kernels.vec16 import _vhsum4_store, _vload, _vload_rows4x2, _vmuladd, _vstore, _vstore_rows4x2, _vzero

_JIT = dict(cache=True, error_model="numpy")


@njit(**_JIT)
def _qk4x4(qbuf, v, kbuf, j, sc):
    """sc[v + a, j + b] = qbuf[v + a] . kbuf[j + b] for a, b in 0..3 (rows of 2-D C-contiguous scratch)."""
    Dp = qbuf.shape[1]
    q0, k0 = v * Dp, j * Dp
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = _vzero()
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = _vzero()
    for c in range(0, Dp, 16):
        k_0 = _vload(kbuf, k0 + c)
        k_1 = _vload(kbuf, k0 + Dp + c)
        k_2 = _vload(kbuf, k0 + 2 * Dp + c)
        k_3 = _vload(kbuf, k0 + 3 * Dp + c)
        x = _vload(qbuf, q0 + c)
        a00, a01, a02, a03 = _vmuladd(a00, x, k_0), _vmuladd(a01, x, k_1), _vmuladd(a02, x, k_2), _vmuladd(a03, x, k_3)
        x = _vload(qbuf, q0 + Dp + c)
        a10, a11, a12, a13 = _vmuladd(a10, x, k_0), _vmuladd(a11, x, k_1), _vmuladd(a12, x, k_2), _vmuladd(a13, x, k_3)
        x = _vload(qbuf, q0 + 2 * Dp + c)
        a20, a21, a22, a23 = _vmuladd(a20, x, k_0), _vmuladd(a21, x, k_1), _vmuladd(a22, x, k_2), _vmuladd(a23, x, k_3)
        x = _vload(qbuf, q0 + 3 * Dp + c)
        a30, a31, a32, a33 = _vmuladd(a30, x, k_0), _vmuladd(a31, x, k_1), _vmuladd(a32, x, k_2), _vmuladd(a33, x, k_3)
    W = sc.shape[1]
    _vhsum4_store(a00, a01, a02, a03, sc, v * W + j)
    _vhsum4_store(a10, a11, a12, a13, sc, (v + 1) * W + j)
    _vhsum4_store(a20, a21, a22, a23, sc, (v + 2) * W + j)
    _vhsum4_store(a30, a31, a32, a33, sc, (v + 3) * W + j)


@njit(**_JIT)
def _qk1x4(qbuf, v, kbuf, j, sc):
    """_qk4x4 for one query vector."""
    Dp = qbuf.shape[1]
    q0, k0 = v * Dp, j * Dp
    a0 = a1 = a2 = a3 = _vzero()
    for c in range(0, Dp, 16):
        x = _vload(qbuf, q0 + c)
        a0 = _vmuladd(a0, x, _vload(kbuf, k0 + c))
        a1 = _vmuladd(a1, x, _vload(kbuf, k0 + Dp + c))
        a2 = _vmuladd(a2, x, _vload(kbuf, k0 + 2 * Dp + c))
        a3 = _vmuladd(a3, x, _vload(kbuf, k0 + 3 * Dp + c))
    _vhsum4_store(a0, a1, a2, a3, sc, v * sc.shape[1] + j)


@njit(**_JIT)
def _pv4(acc, v, p, vbuf, n):
    """acc[v + a] += sum over keys j < n, in order, of p[v + a, j] * vbuf[j], for a in 0..3."""
    Dp = acc.shape[1]
    a0 = v * Dp
    for c in range(0, Dp, 32):
        x00, x01, x10, x11, x20, x21, x30, x31 = _vload_rows4x2(acc, a0, Dp, c)
        for j in range(n):
            v0, v1 = _vload(vbuf, j * Dp + c), _vload(vbuf, j * Dp + c + 16)
            w = p[v, j]
            x00, x01 = _vmuladd(x00, v0, w), _vmuladd(x01, v1, w)
            w = p[v + 1, j]
            x10, x11 = _vmuladd(x10, v0, w), _vmuladd(x11, v1, w)
            w = p[v + 2, j]
            x20, x21 = _vmuladd(x20, v0, w), _vmuladd(x21, v1, w)
            w = p[v + 3, j]
            x30, x31 = _vmuladd(x30, v0, w), _vmuladd(x31, v1, w)
        _vstore_rows4x2(acc, a0, Dp, c, x00, x01, x10, x11, x20, x21, x30, x31)


@njit(**_JIT)
def _pv1(acc, v, p, vbuf, n):
    """_pv4 for one query vector (two 16-lane chunks at a time, like _pv4)."""
    Dp = acc.shape[1]
    a0 = v * Dp
    for c in range(0, Dp, 32):
        x0, x1 = _vload(acc, a0 + c), _vload(acc, a0 + c + 16)
        for j in range(n):
            w = p[v, j]
            x0 = _vmuladd(x0, _vload(vbuf, j * Dp + c), w)
            x1 = _vmuladd(x1, _vload(vbuf, j * Dp + c + 16), w)
        _vstore(acc, a0 + c, x0)
        _vstore(acc, a0 + c + 16, x1)


@njit(**_JIT)
def scores(qbuf, kbuf, nv, n, sc, use_bf16, qb, kt):
    """sc[v, :n] = q vector v . key jj for the tile's nv query vectors, in float32 or from the bf16 copies qb, kt
    (kt: attention_bf16.round_block's keys in pairs of D; keys past n are stale or zero but finite, their scores
    unused)."""
    if use_bf16:  # keys along the lanes, 16 at a time
        for c in range(0, n, 16):
            v = 0
            while v + 8 <= nv:
                B16.qk8(qb, v, kt, c, sc)
                v += 8
            while v < nv:
                B16.qk1(qb, v, kt, c, sc)
                v += 1
        return
    v = 0
    while v + 4 <= nv:
        for jj in range(0, n, 4):
            _qk4x4(qbuf, v, kbuf, jj, sc)
        v += 4
    while v < nv:
        for jj in range(0, n, 4):
            _qk1x4(qbuf, v, kbuf, jj, sc)
        v += 1


@njit(**_JIT)
def weighted_sum(acc, sc, nv, n, vbuf, use_bf16, pb, vb):
    """acc[v] += sum over keys jj < n of weight sc[v, jj] x value jj, in float32 or from bf16 copies (pb, vb)."""
    if use_bf16:
        B16.round_weights(sc, nv, n, pb)
    npairs = (n + 1) // 2
    v = 0
    while v + 4 <= nv:
        if use_bf16:
            B16.pv4(acc, v, pb, vb, npairs)
        else:
            _pv4(acc, v, sc, vbuf, n)
        v += 4
    while v < nv:
        if use_bf16:
            B16.pv1(acc, v, pb, vb, npairs)
        else:
            _pv1(acc, v, sc, vbuf, n)
        v += 1
