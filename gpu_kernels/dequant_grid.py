"""The grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), TQ1_0, TQ2_0 and NVFP4 dequantized by
torch on any device, operation for operation as gguf-py's `dequantize_blocks` (so bit-equal to it), as dequant.py
does for the other formats. Input: uint8 blocks (n, type_size); output: float32 (n, block_size).
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from gguf import quants


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).to(torch.float32)


def _u16(b: torch.Tensor) -> torch.Tensor:
    """uint8 (n, 2 m) little-endian -> int32 (n, m)."""
    return b.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def _u32(b: torch.Tensor) -> torch.Tensor:
    """uint8 (n, 4 m) little-endian -> int64 (n, m) (unsigned: shifts are logical)."""
    return b.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _shr(x: torch.Tensor, shifts, dev) -> torch.Tensor:
    """x (...) -> (..., len(shifts)): x >> each shift."""
    return x.unsqueeze(-1) >> torch.tensor(shifts, dtype=x.dtype, device=dev)


def _signs(bits_src: torch.Tensor) -> torch.Tensor:
    """sign bytes (...) -> (..., 8) float32: -1 where bit i is set, else 1."""
    bits = _shr(bits_src.to(torch.int32), list(range(8)), bits_src.device) & 1
    return torch.where(bits == 0, 1.0, -1.0).to(torch.float32)


@functools.lru_cache(maxsize=None)
def _table(name: str, dev: str) -> torch.Tensor:
    """gguf's grid of quants.<name> (float32 (n, width)), or KSIGNS (int64 (128,)), on device dev."""
    if name == "ksigns":
        return torch.from_numpy(np.frombuffer(quants.IQ2_XXS.ksigns, np.uint8).astype(np.int64)).to(dev)
    cls = getattr(quants, name)
    cls.init_grid()
    g = np.asarray(cls.grid, np.float32)
    return torch.from_numpy(g.reshape(g.shape[-2], g.shape[-1]).copy()).to(dev)


def _grid(name, idx):
    return _table(name, str(idx.device))[idx.to(torch.int64)]


def _ksigns(idx):
    return _table("ksigns", str(idx.device))[idx.to(torch.int64)]


def _nibbles(b: torch.Tensor) -> torch.Tensor:
    """uint8 (n, m) -> int32 (n, 2 m): each byte's low nibble, then its high one."""
    return (_shr(b.to(torch.int32), [0, 4], b.device) & 15).reshape(b.shape[0], -1)


def iq2_xxs(b):
    n, dev = b.shape[0], b.device
    d = _f16(b[:, :2])
    w = _u32(b[:, 2:]).reshape(n, 8, 2)
    db = (d * (0.5 + (w[..., 1] >> 28).to(torch.float32)) * 0.25).reshape(n, 8, 1, 1)
    signs = _signs(_ksigns(_shr(w[..., 1], [0, 7, 14, 21], dev) & 127))  # (n, 8, 4, 8)
    grid = _grid("IQ2_XXS", b[:, 2:].reshape(n, 8, 8)[..., :4])      # (n, 8, 4, 8)
    return (db * grid * signs).reshape(n, 256)


def iq2_xs(b):
    n = b.shape[0]
    d = _f16(b[:, :2])
    qs = _u16(b[:, 2:66])
    db = (d * (0.5 + _nibbles(b[:, 66:74]).to(torch.float32)) * 0.25).reshape(n, 16, 1, 1)
    signs = _signs(_ksigns(qs >> 9)).reshape(n, 16, 2, 8)
    grid = _grid("IQ2_XS", qs & 511).reshape(n, 16, 2, 8)
    return (db * grid * signs).reshape(n, 256)


def iq2_s(b):
    n, dev = b.shape[0], b.device
    d = _f16(b[:, :2])
    db = (d * (0.5 + _nibbles(b[:, 74:82]).to(torch.float32)) * 0.25).reshape(n, 16, 1, 1)
    signs = _signs(b[:, 34:66]).reshape(n, 16, 2, 8)
    qh = (_shr(b[:, 66:74].to(torch.int32), [0, 2, 4, 6], dev) & 3).reshape(n, 32)
    grid = _grid("IQ2_S", b[:, 2:34].to(torch.int32) | (qh << 8)).reshape(n, 16, 2, 8)
    return (db * grid * signs).reshape(n, 256)


def iq3_xxs(b):
    n, dev = b.shape[0], b.device
    d = _f16(b[:, :2])
    sc = _u32(b[:, 66:98])
    db = (d * (0.5 + (sc >> 28).to(torch.float32)) * 0.5).reshape(n, 8, 1, 1)
    signs = _signs(_ksigns(_shr(sc, [0, 7, 14, 21], dev) & 127))  # (n, 8, 4, 8)
    grid = _grid("IQ3_XXS", b[:, 2:66]).reshape(n, 8, 4, 8)
    return (db * grid * signs).reshape(n, 256)


def iq3_s(b):
    n, dev = b.shape[0], b.device
    d = _f16(b[:, :2])
    db = (d * (1 + 2 * _nibbles(b[:, 106:110])).to(torch.float32)).reshape(n, 8, 1, 1)
    signs = _signs(b[:, 74:106]).reshape(n, 8, 4, 8)
    qh = (_shr(b[:, 66:74].to(torch.int32), list(range(8)), dev) & 1).reshape(n, 64)
    grid = _grid("IQ3_S", b[:, 2:66].to(torch.int32) | (qh << 8)).reshape(n, 8, 4, 8)
    return (db * grid * signs).reshape(n, 256)


def _iq1_delta(bit_set: torch.Tensor) -> torch.Tensor:
    return torch.where(bit_set, -0.125, 0.125).to(torch.float32)


def iq1_s(b):
    n, dev = b.shape[0], b.device
    d = _f16(b[:, :2])
    qh = _u16(b[:, 34:50])
    dl = (d * (2 * ((qh >> 12) & 7) + 1).to(torch.float32)).reshape(n, 8, 1, 1)
    delta = _iq1_delta((qh & 0x8000) != 0).reshape(n, 8, 1, 1)
    idx = b[:, 2:34].to(torch.int32) | ((_shr(qh, [0, 3, 6, 9], dev) & 7) << 8).reshape(n, 32)
    grid = _grid("IQ1_S", idx).reshape(n, 8, 4, 8)
    return (dl * (grid + delta)).reshape(n, 256)


def iq1_m(b):
    n, dev = b.shape[0], b.device
    sc = _u16(b[:, 48:56])  # (n, 4)
    dbits = ((sc & 0xF000) >> torch.tensor([12, 8, 4, 0], dtype=torch.int32, device=dev)).sum(-1)  # disjoint bits
    d = dbits.to(torch.int16).view(torch.float16).to(torch.float32).reshape(n, 1)
    dl = (d * (2 * (_shr(sc, [0, 3, 6, 9], dev) & 7).reshape(n, 16) + 1).to(torch.float32)).reshape(n, 8, 2, 1, 1)
    qh = _nibbles(b[:, 32:48])  # (n, 32)
    delta = _iq1_delta((qh & 8) != 0).reshape(n, 8, 2, 2, 1)
    grid = _grid("IQ1_M", b[:, :32].to(torch.int32) | ((qh & 7) << 8)).reshape(n, 8, 2, 2, 8)
    return (dl * (grid + delta)).reshape(n, 256)


def tq1_0(b):
    n, dev = b.shape[0], b.device
    pw = torch.tensor([1, 3, 9, 27, 81], dtype=torch.uint8, device=dev)
    qs0 = (b[:, :32].reshape(n, 1, 32) * pw.reshape(1, 5, 1)).reshape(n, 160)  # uint8 products wrap, as gguf's
    qs1 = (b[:, 32:48].reshape(n, 1, 16) * pw.reshape(1, 5, 1)).reshape(n, 80)
    qh = (b[:, 48:52].reshape(n, 1, 4) * pw[:4].reshape(1, 4, 1)).reshape(n, 16)
    q = ((torch.cat([qs0, qs1, qh], dim=-1).to(torch.int32) * 3) >> 8) - 1
    return _f16(b[:, 52:54]) * q.to(torch.float32)


def tq2_0(b):
    n, dev = b.shape[0], b.device
    q = (_shr(b[:, :64].to(torch.int32).reshape(n, 2, 32), [0, 2, 4, 6], dev) & 3).transpose(-1, -2).reshape(n, 256)
    return _f16(b[:, 64:66]) * (q - 1).to(torch.float32)


NVFP4_KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def nvfp4(b):
    n, dev = b.shape[0], b.device
    x = b[:, :4].to(torch.int32)
    exp, man = (x >> 3) & 15, (x & 7).to(torch.float32)
    raw = torch.where(exp == 0, man * 2.0 ** -9, (1.0 + man / 8.0) * torch.exp2(exp.to(torch.float32) - 7))
    d = torch.where((x == 0) | (x == 0x7F), 0.0, raw * 0.5).reshape(n, 4, 1)
    qs = b[:, 4:].reshape(n, 4, 8).to(torch.int32)
    codes = torch.cat([qs & 15, qs >> 4], dim=-1)  # (n, 4, 16)
    vals = torch.tensor(NVFP4_KVALUES, dtype=torch.float32, device=dev)[codes.to(torch.int64)]
    return (d * vals).reshape(n, 64)
