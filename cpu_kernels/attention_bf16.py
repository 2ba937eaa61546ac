"""The bf16 stages of paged attention's tiles (attention._attend_tile with use_bf16): scores and the weighted sum
of V from bf16 roundings of q, K, V and the softmax weights, float32 sums (bf16x32._bdot: vdpbf16ps).

Taken by long prefill chunks where the dense matmuls run in bf16 too (EngineArgs.prefill_dtype). A row's
arithmetic is still fixed by construction: its q, a key and a value round the same way in any tile, the
scores sum the same 16 lanes of D pairs in the same order, and V is walked in pairs of keys counted from the
block's start (a pair past the row's keys has weight exactly 0), so a row gets the same bits in any tile.
Layouts (uint16 bf16 bits, 2-D C-contiguous): qb/kb rows of Dp; vb row jp holds keys 2 jp and 2 jp + 1
interleaved per element of D; pb row v the weights of query vector v in key order.
"""
from __future__ import annotations

from numba import njit

from cpu_kernels.bf16x32 import _bdot, _bload, _bround, _bsplat2, _bstore, _bzip
from cpu_kernels.vec16 import _vhsum4_store, _vload, _vstore, _vzero

_JIT = dict(cache=True, error_model="numpy")


@njit(**_JIT)
def round_block(kbuf, vbuf, n, kb, vb):
    """The block's n float32 keys and values (kbuf, vbuf rows) rounded to bf16: keys as rows of kb, values in
    pairs of keys as rows of vb (an odd last key is paired with itself; its partner's weight is 0)."""
    Dp = kb.shape[1]
    for jj in range(n):
        for c in range(0, Dp, 32):
            _bstore(kb, jj * Dp + c, _bround(_vload(kbuf, jj * Dp + c), _vload(kbuf, jj * Dp + c + 16)))
    for jp in range((n + 1) // 2):
        ja = 2 * jp
        jb = ja + 1 if ja + 1 < n else ja
        for c in range(0, Dp, 16):
            _bstore(vb, jp * 2 * Dp + 2 * c, _bzip(_vload(vbuf, ja * Dp + c), _vload(vbuf, jb * Dp + c)))


@njit(**_JIT)
def qk4x4(qb, v, kb, j, sc):
    """sc[v + a, j + b] = qb[v + a] . kb[j + b] for a, b in 0..3."""
    Dp = qb.shape[1]
    q0, k0 = v * Dp, j * Dp
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = _vzero()
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = _vzero()
    for c in range(0, Dp, 32):
        k_0 = _bload(kb, k0 + c)
        k_1 = _bload(kb, k0 + Dp + c)
        k_2 = _bload(kb, k0 + 2 * Dp + c)
        k_3 = _bload(kb, k0 + 3 * Dp + c)
        x = _bload(qb, q0 + c)
        a00, a01, a02, a03 = _bdot(a00, x, k_0), _bdot(a01, x, k_1), _bdot(a02, x, k_2), _bdot(a03, x, k_3)
        x = _bload(qb, q0 + Dp + c)
        a10, a11, a12, a13 = _bdot(a10, x, k_0), _bdot(a11, x, k_1), _bdot(a12, x, k_2), _bdot(a13, x, k_3)
        x = _bload(qb, q0 + 2 * Dp + c)
        a20, a21, a22, a23 = _bdot(a20, x, k_0), _bdot(a21, x, k_1), _bdot(a22, x, k_2), _bdot(a23, x, k_3)
        x = _bload(qb, q0 + 3 * Dp + c)
        a30, a31, a32, a33 = _bdot(a30, x, k_0), _bdot(a31, x, k_1), _bdot(a32, x, k_2), _bdot(a33, x, k_3)
    W = sc.shape[1]
    _vhsum4_store(a00, a01, a02, a03, sc, v * W + j)
    _vhsum4_store(a10, a11, a12, a13, sc, (v + 1) * W + j)
    _vhsum4_store(a20, a21, a22, a23, sc, (v + 2) * W + j)
    _vhsum4_store(a30, a31, a32, a33, sc, (v + 3) * W + j)


@njit(**_JIT)
def qk1x4(qb, v, kb, j, sc):
    """qk4x4 for one query vector."""
    Dp = qb.shape[1]
    q0, k0 = v * Dp, j * Dp
    a0 = a1 = a2 = a3 = _vzero()
    for c in range(0, Dp, 32):
        x = _bload(qb, q0 + c)
        a0 = _bdot(a0, x, _bload(kb, k0 + c))
        a1 = _bdot(a1, x, _bload(kb, k0 + Dp + c))
        a2 = _bdot(a2, x, _bload(kb, k0 + 2 * Dp + c))
        a3 = _bdot(a3, x, _bload(kb, k0 + 3 * Dp + c))
    _vhsum4_store(a0, a1, a2, a3, sc, v * sc.shape[1] + j)


@njit(**_JIT)
def pv4(acc, v, pb, vb, npairs):
    """acc[v + a] += the weighted values of the block's key pairs, in order, for a in 0..3."""
    Dp, P = acc.shape[1], pb.shape[1]
    a0 = v * Dp
    for c in range(0, Dp, 32):
        x00, x01 = _vload(acc, a0 + c), _vload(acc, a0 + c + 16)
        x10, x11 = _vload(acc, a0 + Dp + c), _vload(acc, a0 + Dp + c + 16)
        x20, x21 = _vload(acc, a0 + 2 * Dp + c), _vload(acc, a0 + 2 * Dp + c + 16)
        x30, x31 = _vload(acc, a0 + 3 * Dp + c), _vload(acc, a0 + 3 * Dp + c + 16)
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
        _vstore(acc, a0 + c, x00)
        _vstore(acc, a0 + c + 16, x01)
        _vstore(acc, a0 + Dp + c, x10)
        _vstore(acc, a0 + Dp + c + 16, x11)
        _vstore(acc, a0 + 2 * Dp + c, x20)
        _vstore(acc, a0 + 2 * Dp + c + 16, x21)
        _vstore(acc, a0 + 3 * Dp + c, x30)
        _vstore(acc, a0 + 3 * Dp + c + 16, x31)


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
