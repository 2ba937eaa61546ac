"""Structured outputs' token masks on the logits: row rows[j] keeps the tokens whose bit is set in bitmask[j] (int32
words, bit t % 32 of word t // 32, as xgrammar and llguidance fill them) and the others become -inf, in place.
One pass over each row (no unpacked copy of the mask, no gathered copy of the logits)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_NEG_INF = np.float32(-np.inf)


@njit(cache=True, error_model="numpy")
def _mask_row(x, words, allowed, j):
    any_ = False
    for w in range(words.shape[1]):
        bits = np.uint32(words[j, w])
        any_ |= bits != 0
        base = 32 * w
        for b in range(min(32, x.shape[0] - base)):
            if not (bits >> np.uint32(b)) & np.uint32(1):
                x[base + b] = _NEG_INF
    allowed[j] = any_


@njit(cache=True, error_model="numpy", parallel=True)
def _apply(logits, rows, words, allowed):
    for j in prange(rows.shape[0]):
        _mask_row(logits[rows[j]], words, allowed, j)


def apply_token_bitmask(logits: np.ndarray, rows: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """logits f32 (R, V) C-contiguous, masked in place at rows (int64 (n,)) by bitmask int32 (n, ceil(V / 32)).
    Returns bool (n,): whether the row's mask allows any token."""
    if bitmask.shape != (rows.shape[0], (logits.shape[1] + 31) // 32):
        raise ValueError("apply_token_bitmask: one bitmask row of ceil(V / 32) words per masked row")
    if logits.dtype != np.float32 or not logits.flags.c_contiguous or logits.ndim != 2:
        raise ValueError("apply_token_bitmask: logits must be C-contiguous float32 (R, V), masked in place")
    if rows.size and (rows.min() < 0 or rows.max() >= logits.shape[0]):
        raise ValueError("apply_token_bitmask: a row index outside the logits")
    allowed = np.zeros(rows.shape[0], np.bool_)
    _apply(logits, np.ascontiguousarray(rows, np.int64), np.ascontiguousarray(bitmask, np.int32), allowed)
    return allowed
