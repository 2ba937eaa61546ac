"""The bf16 stages of paged attention's tiles (attention._attend_items with use_bf16): scores and the weighted sum
of V from bf16 roundings of q, K, V and the softmax weights, float32 sums (bf16x32._bdot: vdpbf16ps).

Taken by long prefill chunks where the dense matmuls run in bf16 too (EngineArgs.prefill_dtype). A row's
arithmetic is still fixed by construction: its q, a key and a value round the same way in any tile, a
score sums the pairs of D in order in one lane, and V is walked in pairs of keys counted from the
block's start (a pair past the row's keys has weight exactly 0), so a row gets the same bits in any tile.
Layouts (uint16 bf16 bits, 2-D C-contiguous): qb rows of Dp; kt row dp holds elements 2 dp, 2 dp + 1 of every key
of the block, key after key; vb row jp holds keys 2 jp and 2 jp + 1 interleaved per element of D; pb row v the
weights of query vector v in key order.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.bf16x32 import _bdot, _bload, _bround, _bsplat2, _bstore, _bzip
from cpu_kernels.vec16 import _vload, _vload_rows4x2, _vstore, _vstore_rows4x2, _vzero

_JIT = dict(cache=True, error_model="numpy")


@njit(**_JIT)
def round_block(kbuf, vbuf, n, kt, vb):
    """The block's n float32 keys and values (kbuf, vbuf rows) rounded to bf16: keys in pairs of D (kt row dp holds
    elements 2 dp and 2 dp + 1 of each key side by side, key after key; the lanes of missing keys stay as they are),
    values in pairs of keys as rows of vb (an odd last key is paired with itself; its partner's weight is 0)."""
    Dp = kbuf.shape[1]
    row = np.empty(Dp, np.uint16)
    for jj in range(n):
        for c in range(0, Dp, 32):
            _bstore(row, c, _bround(_vload(kbuf, jj * Dp + c), _vload(kbuf, jj * Dp + c + 16)))
        for dp in range(Dp // 2):
            kt[dp, 2 * jj] = row[2 * dp]
            kt[dp, 2 * jj + 1] = row[2 * dp + 1]
    for jp in range((n + 1) // 2):
        ja = 2 * jp
        jb = ja + 1 if ja + 1 < n else ja
        for c in range(0, Dp, 16):
            _bstore(vb, jp * 2 * Dp + 2 * c, _bzip(_vload(vbuf, ja * Dp + c), _vload(vbuf, jb * Dp + c)))


@njit(**_JIT)
def qk8(qb, v, kt, c, sc):
    """sc[v + a, c:c + 16] = qb[v + a] . keys c..c+15 for a in 0..7: the keys along the lanes (kt: round_block's
    pairs of D), each query's pair of D broadcast, so no lane sums; one chain per query vector, D pair after pair."""
    Dp, T = qb.shape[1], kt.shape[1]
    q0 = v * Dp
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = _vzero()
    for dp in range(Dp // 2):
        k = _bload(kt, dp * T + 2 * c)
        a0 = _bdot(a0, k, _bsplat2(qb, q0 + 2 * dp))
        a1 = _bdot(a1, k, _bsplat2(qb, q0 + Dp + 2 * dp))
        a2 = _bdot(a2, k, _bsplat2(qb, q0 + 2 * Dp + 2 * dp))
        a3 = _bdot(a3, k, _bsplat2(qb, q0 + 3 * Dp + 2 * dp))
        a4 = _bdot(a4, k, _bsplat2(qb, q0 + 4 * Dp + 2 * dp))
        a5 = _bdot(a5, k, _bsplat2(qb, q0 + 5 * Dp + 2 * dp))
        a6 = _bdot(a6, k, _bsplat2(qb, q0 + 6 * Dp + 2 * dp))
        a7 = _bdot(a7, k, _bsplat2(qb, q0 + 7 * Dp + 2 * dp))
    W = sc.shape[1]
    _vstore(sc, v * W + c, a0)
    _vstore(sc, (v + 1) * W + c, a1)
    _vstore(sc, (v + 2) * W + c, a2)
    _vstore(sc, (v + 3) * W + c, a3)
    _vstore(sc, (v + 4) * W + c, a4)
    _vstore(sc, (v + 5) * W + c, a5)
    _vstore(sc, (v + 6) * W + c, a6)
    _vstore(sc, (v + 7) * W + c, a7)


@njit(**_JIT)
def qk1(qb, v, kt, c, sc):
    """qk8 for one query vector (the same chain, the same bits)."""
    Dp, T = qb.shape[1], kt.shape[1]
    a = _vzero()
    for dp in range(Dp // 2):
        a = _bdot(a, _bload(kt, dp * T + 2 * c), _bsplat2(qb, v * Dp + 2 * dp))
    _vstore(sc, v * sc.shape[1] + c, a)


@njit(**_JIT)
def pv4(acc, v, pb, vb, npairs):
    """acc[v + a] += the weighted values of the block's key pairs, in order, for a in 0..3."""
    Dp, P = acc.shape[1], pb.shape[1]
    a0 = v * Dp
    for c in range(0, Dp, 32):
        x00, x01, x10, x11, x20, x21, x30, x31 = _vload_rows4x2(acc, a0, Dp, c)
        for jp in range(npairs):
            v0, v1 = _bload(vb, jp * 2 * Dp + 2 * c), _bload(vb, jp * 2 * Dp + 2 * c + 32)
            w = _bsplat2(pb, v * P + 2 * jp)
            x00, x01 = _bdot(x00, v0, w), _bdot(x01, v1, w)
            w = _bsplat2(pb, (v + 1) * P + 2 * jp)
            x10, x11 = _bdot(x10, v0, w), _bdot(x11, v1, w)
            w = _bsplat2(pb, (v + 2) * P + 2 * jp)
            x20, x21 = _bdot(x20, v0, w), _bdot(x21, v1, w)
            w = _bsplat2(pb, (v + 3) * P + 2 * jp)
            x30, x31 = _bdot(x30, v0, w), _bdot(x31, v1, w)
        _vstore_rows4x2(acc, a0, Dp, c, x00, x01, x10, x11, x20, x21, x30, x31)


@njit(**_JIT)
def pv1(acc, v, pb, vb, npairs):
    """pv4 for one query vector."""
    Dp, P = acc.shape[1], pb.shape[1]
    a0 = v * Dp
    for c in range(0, Dp, 32):
        x0, x1 = _vload(acc, a0 + c), _vload(acc, a0 + c + 16)
        for jp in range(npairs):
            w = _bsplat2(pb, v * P + 2 * jp)
            x0 = _bdot(x0, _bload(vb, jp * 2 * Dp + 2 * c), w)
            x1 = _bdot(x1, _bload(vb, jp * 2 * Dp + 2 * c + 32), w)
        _vstore(acc, a0 + c, x0)
        _vstore(acc, a0 + c + 16, x1)


@njit(**_JIT)
def round_weights(sc, nv, n, pb):
    """The tile's softmax weights sc[v, :n] rounded into pb (16-lane chunks of sc; an odd n's pad weight exactly
    0: pv4 multiplies whole pairs)."""
    W, P = sc.shape[1], pb.shape[1]
    for v in range(nv):
        for c in range(0, n, 32):
            hi = _vload(sc, v * W + c + 16) if c + 16 < W else _vzero()
            _bstore(pb, v * P + c, _bround(_vload(sc, v * W + c), hi))
        if n % 2:
            pb[v, n] = 0
