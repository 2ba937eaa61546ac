"""Paged KV cache: write new K/V rows, and attention of a mixed batch over the cached blocks.

Cache layout (num_blocks, block_size, Hkv, D), float16 (default), float32 or fp8 bytes (kv_cache_dtype fp8_e4m3 in
uint8, fp8_e5m2 in int8: f16.py converts them as each block is read). Numba cannot type float16
arrays on the CPU (numba 0.68 raises NotImplementedError('float16') for any use, even passing one), so
the public functions are thin Python wrappers that hand float16 caches to the kernels as their uint16
bits. The kernels convert with LLVM's half<->float conversions (one vcvtph2ps/vcvtps2ph per 16 values
where the CPU has F16C, round-to-nearest-even) or, on an x86 CPU without F16C, with the integer bit
routines of cpu_kernels/f16.py, which give the same bits (tests check both against numpy over all halfs).

paged_attention works on tiles: a few rows of one sequence x the query heads of one kv head. Each K/V
block is converted once per tile and the scores and the weighted sum of V run in explicit 16-lane vector
kernels, 4 query vectors at a time (attention_products.py; decode of 4 heads: 60 us per layer at 512 tokens, D=256,
one thread); the online softmax lives in attention_softmax.py, the K/V block preparation in attention_blocks.py, and
the bf16 products of long prefill chunks in attention_bf16.py.
Batch invariance: a row's keys are visited block by block in position order, and the vector arithmetic
per (query vector, key) is fixed by construction, so a row gets the same bits whatever tile, kernel
variant, thread or batch computes it (tests check this bitwise). Threads take contiguous runs of tiles
of about equal work; the heads of a group are split only when rows x kv heads < threads (decoding one
sequence).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels import attention_blocks as KV
from cpu_kernels import attention_products as P
from cpu_kernels import attention_softmax as SM
from cpu_kernels.bf16x32 import _bround, _bstore
from cpu_kernels.kv_rows import head_dim, store_row
from cpu_kernels.quant.threads import num_threads
from cpu_kernels.vec16 import _vload

_JIT = dict(cache=True, error_model="numpy")
_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_NEG_INF = np.float32(-np.inf)
TILE_VECS = 32  # query vectors (rows x heads of a group) per tile: each K/V block is converted once per tile
# (a 512-token prefill, 4 heads of 256 on one kv head: 5.6-6.4 ms at 8, 4.4-5.3 at 32; 2048 tokens 83-92 -> 71-74)
ROW_GROUP = 8  # most items (kv heads x head chunks) of one decode row that walk its blocks together
ROW_GROUP_MIN_KEYS = 2048  # ... and only past this many keys: a shorter context's K/V stay in cache between passes,
# where the group's larger scratch only crowds L1


# ---------------------------------------------------------------- write_kv
@njit(**_JIT)
def _slot_place(slot, k_cache):
    """(block, offset) of a cache slot; raises past the end (callers skip negative, padding, slots)."""
    BS = k_cache.shape[1]
    if slot >= k_cache.shape[0] * BS:
        raise ValueError("write_kv: slot outside the cache")
    return slot // BS, slot % BS


@njit(**_JIT)
def _store_head(kr, vr, k_cache, v_cache, blk, off, h):
    """One kv head's K and V rows (f32 (D,)) into their cache slot: the code every KV write here runs."""
    store_row(kr, k_cache[blk, off, h])
    store_row(vr, v_cache[blk, off, h])


@njit(**_JIT)
def _write_kv(k, v, k_cache, v_cache, slot_mapping):
    for t in range(k.shape[0]):
        if slot_mapping[t] < 0:  # padding row
            continue
        blk, off = _slot_place(slot_mapping[t], k_cache)
        for h in range(k.shape[1]):
            _store_head(k[t, h], v[t, h], k_cache, v_cache, blk, off, h)


def _kernel_view(cache: np.ndarray) -> np.ndarray:
    if cache.dtype == np.float16:
        return cache.view(np.uint16)
    if cache.dtype in (np.float32, np.uint16, np.uint8, np.int8):  # fp8 e4m3fn / e5m2 bytes, or (5-D uint8) q8_0
        return cache
    raise TypeError(f"KV cache must be float16, float32, fp8 bytes (uint8 e4m3fn, int8 e5m2) or q8_0 blocks "
                    f"(5-D uint8), got {cache.dtype} {cache.shape}")


def write_kv(k, v, k_cache, v_cache, slot_mapping):
    """Stores new K/V rows into the paged cache.

    Args:
        k, v: f32 (T, Hkv, D). k_cache, v_cache: (num_blocks, block_size, Hkv, D) float16 or float32
        (uint16 is taken as float16 bits), C-contiguous; written in place.
        slot_mapping: int64 (T,), block_id * block_size + offset per row; negative = skip the row.
    Raises:
        ValueError: a slot past the end of the cache.
    """
    _write_kv(k, v, _kernel_view(k_cache), _kernel_view(v_cache), slot_mapping)


# ---------------------------------------------------------------- paged attention
@njit(**_JIT)
def _tile_start(q, t0, nr, h0, nh, qbuf, acc, m, l, use_bf16, qb, sinks):
    """A tile's query vectors into qbuf (and bf16 qb), its running sums acc, max m and sum l reset."""
    D, Dp = q.shape[2], qbuf.shape[1]
    for v in range(nr * nh):
        t, h = t0 + v // nh, h0 + v % nh
        for d in range(D):
            qbuf[v, d] = q[t, h, d]
        for d in range(Dp):
            acc[v, d] = _F0
        m[v] = sinks[h] if sinks.shape[0] else _NEG_INF
        l[v] = _F1 if sinks.shape[0] else _F0
        if use_bf16:
            for c in range(0, Dp, 32):
                _bstore(qb, v * Dp + c, _bround(_vload(qbuf, v * Dp + c), _vload(qbuf, v * Dp + c + 16)))


@njit(**_JIT)
def _tile_keys(row_lo, row_pos, t0, nr):
    """The first key any row of a tile sees and the last (its rows' lo and p)."""
    lo_min, p_max = row_lo[t0], row_pos[t0]
    for r in range(1, nr):
        lo_min, p_max = min(lo_min, row_lo[t0 + r]), max(p_max, row_pos[t0 + r])
    return lo_min, p_max


@njit(inline="always", **_JIT)  # called per block of keys, where passing ~25 arrays shows
def _tile_block(k_cache, v_cache, b, blk, kvh, t0, nr, nh, p_max, row_lo, row_pos, scale, softcap, qbuf, kbuf, vbuf,
                acc, sc, m, l, use_bf16, qb, pb, kt_all, vb_all, cbase):
    """Block b (cache block blk) of a tile's keys folded into its query vectors' online softmax."""
    BS = k_cache.shape[1]
    nv = nr * nh
    # Keys from the block's start (lane jj = key b * BS + jj, whatever the tile): the softmax's vector sums
    # then pair the same keys in any tile. Keys before a row's lo are written ones, given weight 0.
    j0 = b * BS
    j1 = min(p_max + 1, (b + 1) * BS)
    n = j1 - j0
    if use_bf16:
        ci = cbase + b * k_cache.shape[2] + kvh
        kt, vb = kt_all[ci], vb_all[ci]
    else:
        KV.load_block(k_cache, v_cache, blk, kvh, n, kbuf, vbuf)
        kt, vb = kt_all[0], vb_all[0]  # unused
    P.scores(qbuf, kbuf, nv, n, sc, use_bf16, qb, kt)
    for r in range(nr):
        ja, jb = max(row_lo[t0 + r], j0) - j0, min(row_pos[t0 + r] + 1, j1) - j0
        h = 0
        while h + 4 <= nh:  # a row's vectors four at a time (they share its keys)
            SM.block_weights4(sc, r * nh + h, n, ja, jb, scale, softcap, m, l, acc)
            h += 4
        while h < nh:
            SM.block_weights(sc, r * nh + h, n, ja, jb, scale, softcap, m, l, acc)
            h += 1
    P.weighted_sum(acc, sc, nv, n, vbuf, use_bf16, pb, vb)


@njit(**_JIT)
def _tile_finish(out, t0, nr, h0, nh, acc, l):
    """The tile's outputs: each query vector's weighted sum over its softmax's sum."""
    for v in range(nr * nh):
        t, h = t0 + v // nh, h0 + v % nh
        for d in range(out.shape[2]):
            out[t, h, d] = acc[v, d] / l[v]


@njit(**_JIT)
def _attend_items(q, k_cache, v_cache, out, items, i0, i1, G, hc, bt_row, row_lo, row_pos, scale, softcap, qbuf, kbuf,
                  vbuf, acc, sc, m, l, use_bf16, qb, pb, kt_all, vb_all, cbase, sinks):
    """out[t, h] for the tiles of plan items i0..i1-1, which share their rows t0..t0+nr-1 of one sequence: each
    item's query heads h0..h0+nh-1 of its kv head, in scratch of its own (qbuf[g], acc[g], m[g], l[g], qb[g]).

    Query vector v = (row v // nh, head v % nh). The blocks are walked once, in position order, each K/V block
    converted once per item and folded into an online softmax (running max m, sum l); a row ignores the keys
    outside its own range lo..p (weight exactly 0), so its result is the one it gets alone. Several items (a long
    decode row's kv heads: _row_run) read each block's rows of all their kv heads, adjacent in the cache, together
    instead of in one pass over the context per kv head; each item's arithmetic, so its bits, stay the same.
    use_bf16: the scores and the weighted sum of V multiply bf16 roundings of q, K, V and the weights (sums in
    float32; scratch qb, pb): about twice the products per instruction, for long prefill chunks. Their K/V blocks
    were rounded once for the whole call (attention_blocks.bf16_plan): block b of kv head kvh is
    kt_all/vb_all[cbase + b * Hkv + kvh].
    sinks: f32 (Hq,) per-head logits in the softmax's denominator only (gpt-oss), or (0,): the running max and
    sum start at (sink, 1) instead of (-inf, 0), which is exp(sink - max) added to the sum at any later max.
    """
    BS = k_cache.shape[1]
    t0, nr = items[i0, 0], items[i0, 1]
    for g in range(i1 - i0):
        h0, nh = _item_heads(items, i0 + g, G, hc)
        _tile_start(q, t0, nr, h0, nh, qbuf[g], acc[g], m[g], l[g], use_bf16, qb[g], sinks)
    lo_min, p_max = _tile_keys(row_lo, row_pos, t0, nr)
    for b in range(lo_min // BS, p_max // BS + 1):
        for g in range(i1 - i0):
            nh = _item_heads(items, i0 + g, G, hc)[1]
            _tile_block(k_cache, v_cache, b, bt_row[b], items[i0 + g, 3], t0, nr, nh, p_max, row_lo, row_pos, scale,
                        softcap, qbuf[g], kbuf, vbuf, acc[g], sc, m[g], l[g], use_bf16, qb[g], pb, kt_all, vb_all,
                        cbase)
    for g in range(i1 - i0):
        h0, nh = _item_heads(items, i0 + g, G, hc)
        _tile_finish(out, t0, nr, h0, nh, acc[g], l[g])


@njit(**_JIT)
def _item_heads(items, i, G, hc):
    """Plan item i's first query head and head count: chunk items[i, 4] (of hc heads) of kv head items[i, 3]'s G."""
    sp = items[i, 4]
    return items[i, 3] * G + sp * hc, min(G, (sp + 1) * hc) - sp * hc


@njit(**_JIT)
def _plan(q, k_cache, query_start_loc, seq_lens, block_tables, sliding_window, nthreads):
    """Checks the batch and splits it into work items and one contiguous run of items per thread."""
    T, Hq, D = q.shape
    NB, BS, Hkv = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    S = seq_lens.shape[0]
    # Each query row's position p and first visible key lo; checks that keep the kernel in bounds.
    row_pos = np.zeros(T, np.int64)
    row_lo = np.zeros(T, np.int64)
    for s in range(S):
        q0, q1 = query_start_loc[s], query_start_loc[s + 1]
        if q0 < 0 or q1 < q0 or q1 > T or q1 - q0 > seq_lens[s]:
            raise ValueError("paged_attention: bad query_start_loc / seq_lens")
        if seq_lens[s] > 0 and (seq_lens[s] - 1) // BS >= block_tables.shape[1]:
            raise ValueError("paged_attention: block table too short for seq_lens")
        for b in range((seq_lens[s] + BS - 1) // BS):
            if block_tables[s, b] < 0 or block_tables[s, b] >= NB:
                raise ValueError("paged_attention: block id out of range")
        for i in range(q1 - q0):
            p = np.int64(seq_lens[s]) - (q1 - q0) + i
            row_pos[q0 + i] = p
            row_lo[q0 + i] = max(0, p - sliding_window + 1) if sliding_window > 0 else 0
    # Work items: (tile of up to R rows of one sequence, kv head, chunk of the group's heads). The heads
    # are split only when rows x kv heads cannot feed the threads (decoding one sequence).
    nsplit = 1
    if T * Hkv < nthreads:
        nsplit = min(G, (nthreads + T * Hkv - 1) // (T * Hkv))
    hc = (G + nsplit - 1) // nsplit
    nsplit = (G + hc - 1) // hc
    R = max(1, TILE_VECS // hc)
    n_items = 0
    for s in range(S):
        n_items += (query_start_loc[s + 1] - query_start_loc[s] + R - 1) // R * Hkv * nsplit
    items = np.empty((n_items, 5), np.int64)  # first row, rows, sequence, kv head, head chunk
    cum = np.zeros(n_items + 1, np.int64)  # work (keys x heads) up to each item
    i = 0
    for s in range(S):
        for t0 in range(query_start_loc[s], query_start_loc[s + 1], R):
            nr = min(R, query_start_loc[s + 1] - t0)
            keys = 0
            for t in range(t0, t0 + nr):
                keys += row_pos[t] - row_lo[t] + 1 + 8
            for kvh in range(Hkv):
                for sp in range(nsplit):
                    items[i, 0], items[i, 1], items[i, 2], items[i, 3], items[i, 4] = t0, nr, s, kvh, sp
                    cum[i + 1] = cum[i] + keys * (min(G, (sp + 1) * hc) - sp * hc)
                    i += 1
    # Contiguous runs of items with about equal work, one per thread: a causal prefill's last rows
    # cost far more than its first.
    nparts = max(1, min(nthreads, n_items))
    bounds = np.zeros(nparts + 1, np.int64)
    i = 0
    for k in range(1, nparts):
        target = cum[n_items] * k // nparts
        while i < n_items and cum[i + 1] <= target:
            i += 1
        bounds[k] = i
    bounds[nparts] = n_items
    return row_pos, row_lo, items, bounds, hc


@njit(**_JIT)
def _row_run(items, it, hi, row_pos):
    """The end of the run of items from it that are one decode row's (one row, one sequence, at least
    ROW_GROUP_MIN_KEYS keys), at most ROW_GROUP."""
    e = it + 1
    if items[it, 1] != 1 or row_pos[items[it, 0]] + 1 < ROW_GROUP_MIN_KEYS:
        return e
    while (e < hi and e - it < ROW_GROUP and items[e, 1] == 1 and items[e, 0] == items[it, 0]
           and items[e, 2] == items[it, 2]):
        e += 1
    return e


@njit(**_JIT)
def _run_part(q, k_cache, v_cache, block_tables, scale, softcap, row_pos, row_lo, items, lo, hi, hc, out, seq_bf16,
              cbase, kt_all, vb_all, sinks):
    """The items lo:hi of a plan, with scratch for the largest tile among them (decode: one row; a long decode row's
    items, its kv heads, walk its blocks together: _attend_items). Items of the sequences s with
    seq_bf16[s] != 0 run in bf16 (an empty seq_bf16: none) on the blocks of attention_blocks.bf16_plan."""
    D, G, BS = q.shape[2], q.shape[1] // k_cache.shape[2], k_cache.shape[1]
    Dp = (D + 31) // 32 * 32
    BS4 = (BS + 3) // 4 * 4
    nr_max = 1
    ng = 1  # scratch sets: the longest decode row run
    any_bf16 = False
    it = lo
    while it < hi:
        e = _row_run(items, it, hi, row_pos)
        ng = max(ng, e - it)
        for i in range(it, e):
            nr_max = max(nr_max, items[i, 1])
            any_bf16 = any_bf16 or (seq_bf16.shape[0] > 0 and seq_bf16[items[i, 2]] != 0)
        it = e
    nvmax = (nr_max * hc + 3) // 4 * 4
    # an item's scratch is a 2-D C-contiguous [g] (flat index arithmetic with a runtime row length stops LLVM from
    # vectorizing the scalar loops; the vector kernels compute their own offsets)
    qbuf = np.zeros((ng, nvmax, Dp), np.float32)
    kbuf = np.zeros((BS4, Dp), np.float32)
    vbuf = np.zeros((BS, Dp), np.float32)
    acc = np.zeros((ng, nvmax, Dp), np.float32)
    W = (BS + 15) // 16 * 16  # whole 16-lane chunks (the softmax's vectors)
    sc = np.zeros((nvmax, W), np.float32)
    m = np.zeros((ng, nvmax), np.float32)
    l = np.zeros((ng, nvmax), np.float32)
    nb16 = nvmax if any_bf16 else 0  # bf16 scratch (attention_bf16's layouts) only where a tile uses it
    qb = np.zeros((ng, nb16, Dp), np.uint16)
    pb = np.zeros((nb16, (W + 31) // 32 * 32), np.uint16)
    it = lo
    while it < hi:
        e = _row_run(items, it, hi, row_pos)
        s = items[it, 2]
        use_bf16 = seq_bf16.shape[0] > 0 and seq_bf16[s] != 0
        _attend_items(q, k_cache, v_cache, out, items, it, e, G, hc, block_tables[s], row_lo, row_pos,
                      np.float32(scale), np.float32(softcap), qbuf, kbuf, vbuf, acc, sc, m, l, use_bf16, qb, pb,
                      kt_all, vb_all, cbase[s] if use_bf16 else 0, sinks)
        it = e


@njit(**_JIT)
def _check(q, k_cache, v_cache, query_start_loc, seq_bf16, sinks):
    if q.shape[1] % k_cache.shape[2] != 0 or head_dim(k_cache) != q.shape[2] or v_cache.shape != k_cache.shape:
        raise ValueError("paged_attention: q heads / head_dim do not match the KV cache")
    if sinks.shape[0] != 0 and sinks.shape[0] != q.shape[1]:
        raise ValueError("paged_attention: sinks needs one logit per query head")
    if seq_bf16.shape[0] != 0 and seq_bf16.shape[0] != query_start_loc.shape[0] - 1:
        raise ValueError("paged_attention: bf16_seqs needs one flag per sequence")
    return np.zeros(q.shape, np.float32)


@njit(cache=True, error_model="numpy", parallel=True)
def _paged_attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale,
                     sliding_window, softcap, nthreads, seq_bf16, sinks):
    out = _check(q, k_cache, v_cache, query_start_loc, seq_bf16, sinks)
    row_pos, row_lo, items, bounds, hc = _plan(q, k_cache, query_start_loc, seq_lens, block_tables, sliding_window,
                                               nthreads)
    cbase, what = KV.bf16_plan(k_cache, query_start_loc, seq_lens, block_tables, row_lo, seq_bf16)
    kt_all, vb_all = KV.bf16_arrays(k_cache, what)
    for i in prange(what.shape[0] - 1):
        KV.bf16_block(k_cache, v_cache, what, i + 1, kt_all, vb_all)
    for part in prange(bounds.shape[0] - 1):
        _run_part(q, k_cache, v_cache, block_tables, scale, softcap, row_pos, row_lo, items, bounds[part],
                  bounds[part + 1], hc, out, seq_bf16, cbase, kt_all, vb_all, sinks)
    return out


@njit(**_JIT)
def _paged_attention_serial(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale,
                            sliding_window, softcap, seq_bf16, sinks):
    """_paged_attention on the calling thread, without a parallel region's launch (a decode step's layers)."""
    out = _check(q, k_cache, v_cache, query_start_loc, seq_bf16, sinks)
    row_pos, row_lo, items, bounds, hc = _plan(q, k_cache, query_start_loc, seq_lens, block_tables, sliding_window, 1)
    cbase, what = KV.bf16_plan(k_cache, query_start_loc, seq_lens, block_tables, row_lo, seq_bf16)
    kt_all, vb_all = KV.bf16_arrays(k_cache, what)
    for i in range(1, what.shape[0]):
        KV.bf16_block(k_cache, v_cache, what, i, kt_all, vb_all)
    _run_part(q, k_cache, v_cache, block_tables, scale, softcap, row_pos, row_lo, items, 0, bounds[1], hc, out,
              seq_bf16, cbase, kt_all, vb_all, sinks)
    return out


def paged_attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale,
                    sliding_window=0, softcap=0.0, bf16_seqs=None, sinks=None):
    """Causal attention of a mixed batch (decodes, prefill chunks) over the paged KV cache.

    Args:
        q: f32 (T, Hq, D). k_cache, v_cache: (num_blocks, block_size, Hkv, D) float16 or float32,
        already holding this step's K/V (write_kv). query_start_loc: int32 (S+1,). seq_lens: int32 (S,)
        context length after this step. block_tables: int32 (S, max_blocks). scale: score multiplier.
        sliding_window: W > 0 attends to positions p-W+1..p. softcap: > 0 applies cap*tanh(s/cap).
        bf16_seqs: None, or one flag per sequence: the flagged sequences' rows multiply in bf16
        (attention_bf16; float32 sums, about 0.5 % relative error per output).
        sinks: None, or f32 (Hq,): head h's softmax denominator gets exp(sinks[h]) more (a key of logit sinks[h]
        and value 0: gpt-oss's attention sinks), on sliding and full layers alike.
    Returns:
        f32 (T, Hq, D). Row i of sequence s sits at p = seq_lens[s] - q_len_s + i and attends causally;
        query head h reads kv head h // (Hq // Hkv). Rows past query_start_loc[S] are zero.
    Raises:
        ValueError: q_len > seq_len, a block table too short or holding an id outside the cache, q heads /
        head_dim that do not fit the cache, bf16_seqs not one flag per sequence, or sinks not one per head.
    """
    flags = _NO_BF16 if bf16_seqs is None else np.ascontiguousarray(bf16_seqs, dtype=np.uint8)
    sk = NO_SINKS if sinks is None else np.ascontiguousarray(sinks, dtype=np.float32)
    nthreads = num_threads()
    if nthreads == 1:
        return _paged_attention_serial(q, _kernel_view(k_cache), _kernel_view(v_cache), query_start_loc, seq_lens,
                                       block_tables, float(scale), int(sliding_window), float(softcap), flags, sk)
    return _paged_attention(q, _kernel_view(k_cache), _kernel_view(v_cache), query_start_loc, seq_lens,
                            block_tables, float(scale), int(sliding_window), float(softcap), nthreads, flags, sk)


_NO_BF16 = np.zeros(0, np.uint8)  # paged_attention without bf16 rows
NO_SINKS = np.zeros(0, np.float32)  # paged_attention without attention sinks
