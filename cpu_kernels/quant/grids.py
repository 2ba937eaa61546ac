"""The lattice tables of llama.cpp's grid i-quants (IQ1_S/IQ1_M, IQ2_XXS/XS/S, IQ3_XXS/S) as the kernels read them.

The tables are the formats' published constants (ggml-common.h's iq2xxs_grid, ksigns_iq2xs, ...); they are taken
from gguf-py's copies (its quants classes hold them hex-packed) and laid out here as one integer per grid point:
the 8 (IQ3: 4) magnitude bytes of a point, element i in byte i; four such words make a 32-value vector
(k_grid.signed_block), and the sign tables give the matching +-1 bytes.
"""
from __future__ import annotations

import numpy as np
from gguf import quants


def _points(cls) -> np.ndarray:
    """gguf's grid of cls (float32 (1, 1, n, width)) -> its integer values (n, width)."""
    cls.init_grid()
    g = np.asarray(cls.grid, np.float32)
    return g.reshape(g.shape[-2], g.shape[-1]).astype(np.int64)


def _pack(values: np.ndarray, dtype) -> np.ndarray:
    """(n, width) small integers -> (n,) dtype with element i in byte i."""
    b = (values & 0xFF).astype(np.uint8)
    return np.ascontiguousarray(b).view(dtype).reshape(-1)


KSIGNS = np.frombuffer(quants.IQ2_XXS.ksigns, np.uint8).copy()  # 7-bit index -> 8 sign bits (even parity)
# sign byte -> its signs as bytes +1 / -1 (0x01 / 0xFF, bit i for element i), which multiply the activations
SIGN_PM = np.array([sum((0xFF if s >> i & 1 else 0x01) << (8 * i) for i in range(8)) for s in range(256)], np.uint64)
KSIGN_PM = SIGN_PM[KSIGNS]  # 7-bit sign index -> its +-1 bytes (one lookup, not two)
GRID_IQ2XXS = _pack(_points(quants.IQ2_XXS), np.uint64)  # 256 points of 8 magnitudes in {8, 25, 43}
GRID_IQ2XS = _pack(_points(quants.IQ2_XS), np.uint64)    # 512
GRID_IQ2S = _pack(_points(quants.IQ2_S), np.uint64)      # 1024
GRID_IQ3XXS = _pack(_points(quants.IQ3_XXS), np.uint32)  # 256 points of 4 magnitudes 4..62
GRID_IQ3S = _pack(_points(quants.IQ3_S), np.uint32)      # 512 points of 4 magnitudes 1..15
# IQ1: points of 8 values in {-1, 0, 1} plus a delta of +-1/8 per 8 values, held as 8 * value +- 1 (then times
# the scale / 8, exact), as magnitudes and +-1 signs like the other grids: delta + (POS) and delta - (NEG).
_IQ1 = _points(quants.IQ1_S)
GRID_IQ1_POS_MAG, GRID_IQ1_POS_SGN = (_pack(np.abs(8 * _IQ1 + 1), np.uint64),
                                      _pack(np.where(8 * _IQ1 + 1 < 0, -1, 1), np.uint64))
GRID_IQ1_NEG_MAG, GRID_IQ1_NEG_SGN = (_pack(np.abs(8 * _IQ1 - 1), np.uint64),
                                      _pack(np.where(8 * _IQ1 - 1 < 0, -1, 1), np.uint64))
