"""Paged attention in torch over the block-table contract of cpu_kernels/attention.py.

Cache layout (num_blocks, block_size, Hkv, D), float16 or float32, on any torch device, or the CPU's one-byte
storages (engine/core/kv_spec.py): fp8 bytes (e4m3fn in uint8, e5m2 in int8, viewed as torch's float8 types to
convert) and int8 KV's q8_0 blocks (num_blocks, block_size, Hkv, D / 32, 34), the same bytes cpu_kernels writes
(values clamped to the fp8 range and rounded to nearest even; q8_0 as gguf's quantizer). Token i of
sequence s sits at position p = seq_lens[s] - q_len_s + i and attends to positions
max(0, p - sliding_window + 1) .. p; query head h reads kv head h // (Hq // Hkv).

How: the query rows are cut into work items (a run of one sequence's rows) and items are grouped so
that each group's padded scores fit a scratch budget; a group gathers its sequences' blocks, runs one
batched matmul per kv head group (GQA without repeating K/V), masks (causal + window) and softmaxes in
float32. Sequence metadata stays on the host (numpy) so grouping costs no device sync.
"""
from __future__ import annotations

import numpy as np
import torch

from cpu_kernels.kv_rows import head_dim

SCRATCH_BYTES = 256 << 20  # scores + gathered K/V per group, float32


_FP8 = {torch.uint8: (torch.float8_e4m3fn, 448.0), torch.int8: (torch.float8_e5m2, 57344.0)}  # the fp8 bytes


def _q8_0(x: torch.Tensor) -> torch.Tensor:
    """f32 (..., D) -> q8_0 blocks uint8 (..., D / 32, 34): gguf's Q8_0 quantizer (d = amax / 127 stored as f16,
    round(x / d) half away from zero), as cpu_kernels/kv_rows.py."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    d = b.abs().amax(-1, keepdim=True) / 127.0
    v = b * torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    a = v.abs()
    r = a.floor()
    r = r + (2.0 * (a - r)).floor()
    q = torch.where(v < 0, -r, r).to(torch.int8).view(torch.uint8)
    return torch.cat([d.to(torch.float16).view(torch.uint8), q], dim=-1)


def encode(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """f32 rows (..., D) in the storage of cache (its row axes and element type)."""
    if cache.dim() == 5:
        return _q8_0(x.to(torch.float32))
    if cache.dtype in _FP8:
        fp8, top = _FP8[cache.dtype]
        return x.to(torch.float32).clamp(-top, top).to(fp8).view(cache.dtype)
    return x.to(cache.dtype)


def decode(rows: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """Cached rows (..., *row axes) of cache's storage -> f32 (..., D)."""
    if cache.dim() == 5:
        d = rows[..., :2].contiguous().view(torch.float16).to(torch.float32)
        return (rows[..., 2:].view(torch.int8).to(torch.float32) * d).flatten(-2)
    if cache.dtype in _FP8:
        return rows.view(_FP8[cache.dtype][0]).to(torch.float32)
    return rows.to(torch.float32)


def write_rows(x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """x f32 (T, Hkv, D) -> cache rows `slots` (T,) int64 (flat block_id * block_size + offset)."""
    cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, encode(x, cache))


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor) -> None:
    """k, v f32 (T, Hkv, D) -> cache rows `slots` (write_rows).
    Rows with a negative slot (padding) must be filtered out by the caller."""
    write_rows(k, k_cache, slots)
    write_rows(v, v_cache, slots)


def _items(qsl: np.ndarray, lens: np.ndarray, Hq: int, scratch: int) -> list[tuple[int, int, int, int]]:
    """(seq, first row, end row, context length) runs small enough for the scratch budget."""
    out = []
    for s in range(lens.shape[0]):
        q0, q1, L = int(qsl[s]), int(qsl[s + 1]), int(lens[s])
        if q1 <= q0:
            continue
        rows = max(1, scratch // max(1, Hq * L * 4))
        for a in range(q0, q1, rows):
            out.append((s, a, min(q1, a + rows), L))
    return out


def _groups(items, Hq: int, Hkv: int, D: int, bs: int, scratch: int):
    group, qmax, lmax = [], 0, 0
    for it in items:
        q, L = it[2] - it[1], -(-it[3] // bs) * bs
        nq, nl = max(qmax, q), max(lmax, L)
        cost = (len(group) + 1) * (nq * Hq * nl + 2 * nl * Hkv * D) * 4
        if group and cost > scratch:
            yield group
            group, nq, nl = [], q, L
        group.append(it)
        qmax, lmax = nq, nl
    if group:
        yield group


class Group:
    """Sequences attended together: their rows padded to Q, their blocks to nb, as device index tensors.
    Built once per step and shared by every layer with the same head layout (DeviceBatch caches them)."""

    def __init__(self, items, qsl: np.ndarray, bs: int, device):
        B = len(items)
        self.B = B
        self.Q = max(b - a for _, a, b, _ in items)
        self.nb = max(-(-n // bs) for *_, n in items)
        self.L = self.nb * bs
        rows = np.zeros((B, self.Q), np.int64)
        pos = np.zeros((B, self.Q), np.int64)  # padding rows see key 0 only (no NaN); their output is dropped
        valid = np.zeros((B, self.Q), bool)
        for i, (s, a, b, n) in enumerate(items):
            rows[i, : b - a] = np.arange(a, b)
            pos[i, : b - a] = n - (qsl[s + 1] - qsl[s]) + (np.arange(a, b) - qsl[s])
            valid[i, : b - a] = True
        keep = np.flatnonzero(valid.reshape(-1))
        self.seqs = torch.as_tensor([it[0] for it in items], device=device)
        self.rows = torch.as_tensor(rows.reshape(-1), device=device)
        self.pos = torch.as_tensor(pos, device=device)[:, :, None]
        self.keep = torch.as_tensor(keep, device=device)
        self.out_rows = torch.as_tensor(rows.reshape(-1)[keep], device=device)
        self._masks: dict[int, torch.Tensor] = {}

    def visible(self, window: int) -> torch.Tensor:
        """(B, 1, 1, Q, L) bool: key j is visible to the row at position p (causal, sliding window)."""
        if window not in self._masks:
            j = torch.arange(self.L, device=self.pos.device)[None, None, :]
            vis = j <= self.pos
            if window > 0:
                vis &= j > self.pos - window
            self._masks[window] = vis[:, None, None]
        return self._masks[window]


def plan_groups(query_start_loc, seq_lens, Hq: int, Hkv: int, D: int, block_size: int, device,
                scratch_bytes: int = SCRATCH_BYTES) -> list[Group]:
    """The work of one batch, cut into groups whose padded scores and K/V fit `scratch_bytes`."""
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    lens = np.asarray(seq_lens, dtype=np.int64)
    return [Group(g, qsl, block_size, device)
            for g in _groups(_items(qsl, lens, Hq, scratch_bytes), Hq, Hkv, D, block_size, scratch_bytes)]


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc, seq_lens,
                    block_tables: torch.Tensor, scale: float, sliding_window: int = 0, softcap: float = 0.0,
                    scratch_bytes: int = SCRATCH_BYTES, groups: list[Group] | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q f32 (T, Hq, D) -> f32 (T, Hq, D).

    Args:
        k_cache, v_cache: (num_blocks, block_size, Hkv, D) on q's device.
        query_start_loc: int (S+1,) and seq_lens: int (S,), host arrays (numpy or lists).
        block_tables: int (S, max_blocks) on q's device (int32 or int64).
        scale, sliding_window (0 = full), softcap (0 = none): as cpu_kernels.paged_attention.
        groups: plan_groups(...) for this batch, when the caller reuses them across layers.
        sinks: None or f32 (Hq,) on q's device: per-head logits in the softmax's denominator only (gpt-oss).
    """
    T, Hq, D = q.shape
    BS, Hkv = k_cache.shape[1], k_cache.shape[2]
    if Hq % Hkv or head_dim(k_cache) != D or v_cache.shape != k_cache.shape:
        raise ValueError("paged_attention: q heads / head_dim do not match the KV cache")
    G = Hq // Hkv
    if groups is None:
        groups = plan_groups(query_start_loc, seq_lens, Hq, Hkv, D, BS, q.device, scratch_bytes)
    out = torch.zeros_like(q)
    tables = block_tables.to(torch.int64)
    sc = float(np.float32(scale))
    sink_col = None if sinks is None else sinks.to(torch.float32).view(1, Hkv, G, 1, 1)
    for g in groups:
        B, Q, L = g.B, g.Q, g.L
        blk = tables.index_select(0, g.seqs)[:, : g.nb]                               # (B, nb)
        k = decode(k_cache[blk], k_cache).reshape(B, L, Hkv, D).permute(0, 2, 3, 1)    # (B, Hkv, D, L)
        v = decode(v_cache[blk], v_cache).reshape(B, L, Hkv, D).permute(0, 2, 1, 3)    # (B, Hkv, L, D)
        qg = q.index_select(0, g.rows).reshape(B, Q, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * Q, D)
        s_ = torch.matmul(qg, k) * sc                                                 # (B, Hkv, G*Q, L)
        if softcap > 0:
            s_ = softcap * torch.tanh(s_ / softcap)
        s_ = s_.view(B, Hkv, G, Q, L).masked_fill(~g.visible(sliding_window), float("-inf"))
        if sink_col is None:
            probs = torch.softmax(s_, dim=-1).view(B, Hkv, G * Q, L)
        else:  # one more logit per head in the softmax, its column dropped after (transformers' eager gpt-oss)
            s_ = torch.cat([s_, sink_col.expand(B, Hkv, G, Q, 1)], dim=-1)
            probs = torch.softmax(s_, dim=-1)[..., :L].reshape(B, Hkv, G * Q, L)
        o = torch.matmul(probs, v).view(B, Hkv, G, Q, D).permute(0, 3, 1, 2, 4).reshape(B * Q, Hq, D)
        out.index_copy_(0, g.out_rows, o.index_select(0, g.keep))
    return out
