"""Long prefill chunks' attention through torch's bf16 scaled_dot_product_attention, on hosts with AMX.

oneDNN multiplies bf16 on AMX tiles (torch asks the kernel for them), several times what the AVX-512 kernels
of attention_bf16 reach: a 512-token chunk of gemma-3-270m's shape (4 heads of 256 on one kv head) 1.74 ms per
layer against 4.03 (paged_attention's bf16 rows), of the 8B shape (32 heads of 128 on 8) 7.1 ms against 21.0
(2 threads, medians of 5; in the 8B prefill, attention went 2.8 s -> 0.4 s). Each chunk reads
its sequence's keys and values back from the paged cache (as the paged kernel does, so prefix-cached and
chunked prompts see the same cache values); other rows (decodes, short chunks) stay on paged_attention.
Inputs and outputs round to bf16 with float32 sums, like the bf16 rows of paged_attention; neither is batch
invariant, so batch_invariant runs use neither.
"""
from __future__ import annotations


import numpy as np

from cpu_kernels import attention, envs
from cpu_kernels.kv_rows import head_dim
from cpu_kernels.quant.simd import AMX
from cpu_kernels.quant.threads import match_torch_threads


def _fp8_views() -> dict:
    import torch
    return {torch.uint8: torch.float8_e4m3fn, torch.int8: torch.float8_e5m2}


def enabled() -> bool:
    """Whether long chunks take this path: AMX hosts, unless RAMLM_SDPA_PREFILL says 0 or 1."""
    forced = envs.get("RAMLM_SDPA_PREFILL")
    return AMX if forced is None else forced


def sequence_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, seq_len: int,
                       block_row: np.ndarray, scale: float, sliding_window: int = 0) -> np.ndarray:
    """Causal attention of one sequence's last q.shape[0] positions over its seq_len cached keys.

    q: f32 (T, Hq, D); k_cache, v_cache: (num_blocks, block_size, Hkv, D) f16, f32 or fp8 bytes holding positions
    0..seq_len-1 in the blocks block_row lists. Returns f32 (T, Hq, D), as paged_attention's rows.
    """
    import torch
    import torch.nn.functional as F

    match_torch_threads(torch)
    fp8_views = _fp8_views()
    T, Hq, D = q.shape
    BS, Hkv = k_cache.shape[1], k_cache.shape[2]
    if not 0 < T <= seq_len or Hq % Hkv or head_dim(k_cache) != D or v_cache.shape != k_cache.shape:
        raise ValueError("sequence_attention: q does not fit the cache or seq_len")
    ctx = seq_len - T
    # Keys from the first one the first row sees: a sliding window over a long context reads only its tail.
    b0 = (max(0, ctx - sliding_window + 1) if sliding_window > 0 else 0) // BS
    k0, nb = b0 * BS, -(-seq_len // BS)
    if nb > len(block_row):
        raise ValueError("sequence_attention: block table too short for seq_len")
    ids = torch.from_numpy(np.ascontiguousarray(block_row[b0:nb], dtype=np.int64))

    def gathered(cache):  # (1, Hkv, seq_len - k0, D) bf16 (fp8 bytes read as torch's float8 types: exact in bf16)
        c = torch.from_numpy(cache).index_select(0, ids)
        if cache.ndim == 5:  # q8_0 blocks: scale x int8 in float32, the products kv_rows.load_row forms
            c = c[..., 2:].view(torch.int8).float() * c[..., :2].contiguous().view(torch.float16).float()
        elif c.dtype in fp8_views:
            c = c.view(fp8_views[c.dtype])
        c = c.reshape((nb - b0) * BS, Hkv, D)[:seq_len - k0]
        return c.to(torch.bfloat16).permute(1, 0, 2).unsqueeze(0)

    mask, causal = None, True
    if k0 < ctx or 0 < sliding_window < T:  # rows start past the first key, or a window cuts: a mask says which
        pos = torch.arange(ctx, seq_len).unsqueeze(1)
        key = torch.arange(k0, seq_len).unsqueeze(0)
        mask = key <= pos
        if sliding_window > 0:
            mask &= key > pos - sliding_window
        causal = False
    qt = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)).to(torch.bfloat16).permute(1, 0, 2).unsqueeze(0)
    o = F.scaled_dot_product_attention(qt, gathered(k_cache), gathered(v_cache), attn_mask=mask, is_causal=causal,
                                       scale=float(scale), enable_gqa=Hq != Hkv)
    out = np.empty((T, Hq, D), np.float32)
    torch.from_numpy(out).copy_(o[0].permute(1, 0, 2))
    return out


def bidirectional_attention(q, k, v, query_start_loc, seq_lens, scale: float, sliding_window: int = 0) -> np.ndarray:
    """Encoder attention in float32 on this step's own K/V (an encoder's prompt runs whole in one step and is never
    cached): each sequence's rows attend over all of them (a sliding layer: the keys with |i - j| < sliding_window, as
    transformers' bidirectional window). q f32 (T, Hq, D); k, v f32 (T, Hkv, D), views allowed. Returns f32
    (T, Hq, D)."""
    import torch
    import torch.nn.functional as F

    match_torch_threads(torch)
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    out = np.empty((T, Hq, D), np.float32)
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    for s in range(len(seq_lens)):
        a, b, L = int(qsl[s]), int(qsl[s + 1]), int(seq_lens[s])
        if b - a != L:
            raise ValueError(f"bidirectional attention needs a sequence's whole prompt in one step ({b - a} of {L} "
                             f"positions given)")
        if L == 0:
            continue
        mask = None
        if sliding_window > 0:
            pos = torch.arange(L)
            mask = (pos[:, None] - pos[None, :]).abs() < sliding_window
        heads = [t[a:b].permute(1, 0, 2).unsqueeze(0) for t in (qt, kt, vt)]  # (1, H, L, D)
        o = F.scaled_dot_product_attention(*heads, attn_mask=mask, scale=float(scale), enable_gqa=Hq != Hkv)
        torch.from_numpy(out[a:b]).copy_(o[0].permute(1, 0, 2))
    return out


def mixed_attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, sliding_window,
                    long_seqs: np.ndarray) -> np.ndarray:
    """paged_attention (no softcap, no sinks) with the sequences flagged in long_seqs through sequence_attention."""
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    out = np.zeros(q.shape, np.float32)
    rest = []
    for s in range(len(seq_lens)):
        a, b = int(qsl[s]), int(qsl[s + 1])
        if b <= a:
            continue
        if long_seqs[s]:
            out[a:b] = sequence_attention(q[a:b], k_cache, v_cache, int(seq_lens[s]), block_tables[s], scale,
                                          sliding_window)
        else:
            rest.append(s)
    if rest:  # every other row as its own sequence's rows in a smaller batch: the same bits (batch invariance)
        rows = np.concatenate([np.arange(qsl[s], qsl[s + 1]) for s in rest])
        sub_qsl = np.concatenate([[0], np.cumsum([qsl[s + 1] - qsl[s] for s in rest])]).astype(np.int32)
        out[rows] = attention.paged_attention(q[rows], k_cache, v_cache, sub_qsl,
                                              np.ascontiguousarray(seq_lens[rest]),
                                              np.ascontiguousarray(block_tables[rest]), scale, sliding_window)
    return out
