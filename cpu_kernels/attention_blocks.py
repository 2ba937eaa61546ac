"""K/V blocks out of the paged cache for attention's tiles: float32 rows of one block (each tile, float32
products), and the bf16 sequences' blocks rounded once per call (attention_bf16's layouts)."""
from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels import attention_bf16 as B16
from cpu_kernels.kv_rows import head_dim, load_row

_JIT = dict(cache=True, error_model="numpy")


@njit(**_JIT)
def load_block(k_cache, v_cache, blk, kvh, n, kbuf, vbuf):
    """The first n keys and values of a cache block for kv head kvh, as float32 rows of kbuf and vbuf."""
    for jj in range(n):
        load_row(k_cache[blk, jj, kvh], kbuf[jj])
    for jj in range(n):
        load_row(v_cache[blk, jj, kvh], vbuf[jj])


@njit(**_JIT)
def bf16_plan(k_cache, query_start_loc, seq_lens, block_tables, row_lo, seq_bf16):
    """The K/V blocks the bf16 sequences read, each to be rounded once per call (not once per tile: a 512-token
    prompt's 64 tiles visit its 32 blocks 1056 times): per sequence the index base of its blocks in the
    converted arrays, and per converted (block, kv head) the cache block, its keys and its kv head."""
    BS, Hkv = k_cache.shape[1], k_cache.shape[2]
    S = seq_lens.shape[0]
    cbase = np.zeros(S, np.int64)
    first = np.full(S, -1, np.int64)  # first block a bf16 sequence reads (its first row's first visible key: they
    # only grow along a chunk); -1: not converted
    total = 1  # entry 0: a dummy, the arrays' first entry for tiles without bf16
    for s in range(seq_bf16.shape[0]):  # empty seq_bf16 (decode steps): nothing to convert
        if seq_bf16[s] != 0 and query_start_loc[s + 1] > query_start_loc[s]:
            first[s] = row_lo[query_start_loc[s]] // BS
            cbase[s] = total - first[s] * Hkv
            total += ((seq_lens[s] - 1) // BS + 1 - first[s]) * Hkv
    what = np.zeros((total, 3), np.int64)  # cache block, keys, kv head
    for s in range(S):
        if first[s] < 0:
            continue
        for b in range(first[s], (seq_lens[s] - 1) // BS + 1):
            for kvh in range(Hkv):
                i = cbase[s] + b * Hkv + kvh
                what[i, 0], what[i, 1], what[i, 2] = block_tables[s, b], min(BS, seq_lens[s] - b * BS), kvh
    return cbase, what


@njit(**_JIT)
def bf16_block(k_cache, v_cache, what, i, kt_all, vb_all):
    """Entry i of bf16_plan rounded to bf16 into kt_all[i], vb_all[i] (attention_bf16's layouts)."""
    Dp = vb_all.shape[2] // 2
    kbuf = np.zeros((k_cache.shape[1], Dp), np.float32)
    vbuf = np.zeros((k_cache.shape[1], Dp), np.float32)
    load_block(k_cache, v_cache, what[i, 0], what[i, 2], what[i, 1], kbuf, vbuf)
    B16.round_block(kbuf, vbuf, what[i, 1], kt_all[i], vb_all[i])


@njit(**_JIT)
def bf16_arrays(k_cache, what):
    """Room for bf16_plan's blocks in attention_bf16's layouts (empty rows without bf16 sequences: a decode step's
    layers allocate nothing to speak of)."""
    D, BS = head_dim(k_cache), k_cache.shape[1]
    Dp = (D + 31) // 32 * 32
    some = what.shape[0] > 1
    W = (BS + 15) // 16 * 16  # whole 16-key chunks: attention_bf16.qk8 reads 16 lanes
    return (np.zeros((what.shape[0], Dp // 2 if some else 0, 2 * W), np.uint16),
            np.zeros((what.shape[0], (BS + 1) // 2 if some else 0, 2 * Dp), np.uint16))
