"""float32 -> float8 e4m3fn, as FP8 checkpoints are made: a scale per block so that the block's largest magnitude
maps to 448 (e4m3fn's largest finite value), values rounded to nearest even by torch's float8 cast."""
from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """float32 values with |x| <= 448 -> e4m3fn bytes uint8 (round to nearest even)."""
    import torch
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def _scales(amax: np.ndarray) -> np.ndarray:
    return np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1.0)).astype(np.float32)


def quantize_blockwise(w: np.ndarray, block: tuple[int, int] = (128, 128)) -> tuple[np.ndarray, np.ndarray]:
    """w f32 (N, K) -> (e4m3 bytes uint8 (N, K), scale_inv float32 (ceil(N / bn), ceil(K / bk))) with value =
    e4m3 * scale_inv: the layout of `quant_method: fp8` checkpoints with weight_block_size [bn, bk]."""
    w = np.asarray(w, np.float32)
    N, K = w.shape
    bn, bk = block
    gn, gk = -(-N // bn), -(-K // bk)
    pad = np.zeros((gn * bn, gk * bk), np.float32)
    pad[:N, :K] = np.abs(w)
    scale = _scales(pad.reshape(gn, bn, gk, bk).max(axis=(1, 3)))
    full = np.repeat(np.repeat(scale, bn, axis=0), bk, axis=1)[:N, :K]
    return to_e4m3(w / full), scale


def quantize_rows(w: np.ndarray, block: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """w f32 (N, K) -> (e4m3 bytes (N, K), scales float32 (N, K / block)): a scale per `block` values of a row."""
    w = np.asarray(w, np.float32)
    N, K = w.shape
    scale = _scales(np.abs(w.reshape(N, K // block, block)).max(axis=-1))
    return to_e4m3((w.reshape(N, -1, block) / scale[..., None]).reshape(N, K)), scale
