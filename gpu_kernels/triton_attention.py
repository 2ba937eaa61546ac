"""Triton paged attention, one query row per program: the decode kernel over the device block tables.

Same contract and cache layout as gpu_kernels/attention.py: caches (num_blocks, block_size, Hkv, D),
float16 or float32; row t of sequence s sits at position p = seq_lens[s] - q_len_s + (t - query_start_loc[s])
and attends to keys max(0, p - sliding_window + 1) .. p; query head h reads kv head h // (Hq // Hkv).

Program (t, kv head) holds the G query heads of that kv head (GQA without repeating K/V), walks the row's
keys in tiles of BLOCK_L through the block table and keeps an online softmax in float32, so it never
materializes the scores. Any row layout is correct; the modules pick it for decode batches (one row per
sequence: each program reads its keys once, with no padding), and keep the torch path for prefill chunks,
whose rows share their K/V loads there. Importing this module imports triton.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

BLOCK_L = 32  # keys per tile


@triton.jit
def _tanh(x):
    # triton.language has no tanh (only per-backend libdevice); exp of -2|x| cannot overflow.
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x >= 0, y, -y)


@triton.jit
def _paged_rows_kernel(q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, row_seq_ptr, row_pos_ptr,
                       stride_qt, stride_qh, stride_ot, stride_oh, stride_kb, stride_ks, stride_kh, stride_tb,
                       scale, softcap, window, sinks_ptr,
                       G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, BS: tl.constexpr,
                       BLOCK_L: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr):
    # q f32 (T, Hq, D), caches (NB, BS, Hkv, D) -> out f32 (T, Hq, D) for row tl.program_id(0), kv head (1).
    t = tl.program_id(0).to(tl.int64)
    hk = tl.program_id(1)
    s = tl.load(row_seq_ptr + t).to(tl.int64)
    p = tl.load(row_pos_ptr + t)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    gd_ok = (g < G)[:, None] & (d < D)[None, :]
    heads = hk * G + g
    q = tl.load(q_ptr + t * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=gd_ok, other=0.0)
    lo = tl.where(window > 0, tl.maximum(p - window + 1, 0), 0)
    if SINKS:  # a per-head logit in the denominator only: the online softmax starts at (sink, 1)
        m_i = tl.load(sinks_ptr + heads, mask=g < G, other=float("-inf")).to(tl.float32)
        l_i = tl.where(g < G, 1.0, 0.0)
    else:
        m_i = tl.full((GP,), float("-inf"), tl.float32)
        l_i = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, DP), tl.float32)
    # Every tile holds at least one visible key (the first holds lo, the others start at or past it), so
    # the running max is finite after the first tile and no row divides by zero.
    for j0 in range((lo // BLOCK_L) * BLOCK_L, p + 1, BLOCK_L):
        j = j0 + tl.arange(0, BLOCK_L)
        visible = (j >= lo) & (j <= p)
        blk = tl.load(tables_ptr + s * stride_tb + j // BS, mask=visible, other=0).to(tl.int64)
        rows = blk * stride_kb + (j % BS) * stride_ks + hk * stride_kh
        kv_mask = visible[:, None] & (d < D)[None, :]
        k = tl.load(k_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale        # (GP, BLOCK_L)
        if SOFTCAP:
            scores = softcap * _tanh(scores / softcap)
        scores = tl.where(visible[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp(m_i - m_new)
        probs = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(probs, 1)
        v = tl.load(v_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(probs, v, input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + t * stride_ot + heads[:, None] * stride_oh + d[None, :], out, mask=gd_ok)


class RowLayout:
    """Each query row's sequence and position on the device, built once per step and shared by every layer
    (DeviceBatch caches it). Rows query_start_loc[0] .. query_start_loc[-1] - 1 are the ones attended."""

    def __init__(self, query_start_loc, seq_lens, device):
        qsl = np.asarray(query_start_loc, dtype=np.int64)
        lens = np.asarray(seq_lens, dtype=np.int64)
        q_lens = np.diff(qsl)
        seq = np.repeat(np.arange(lens.shape[0]), q_lens)
        rows = np.arange(qsl[0], qsl[-1]) if qsl.size else np.zeros(0, np.int64)
        pos = lens[seq] - q_lens[seq] + (rows - qsl[seq])
        self.first, self.num_rows = int(rows[0]) if rows.size else 0, int(rows.size)
        self.seq = torch.as_tensor(seq.astype(np.int32), device=device)
        self.pos = torch.as_tensor(pos.astype(np.int32), device=device)


def paged_attention_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layout: RowLayout,
                         block_tables: torch.Tensor, scale: float, sliding_window: int = 0, softcap: float = 0.0,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q f32 (T, Hq, D) -> f32 (T, Hq, D); rows outside `layout` (padding) come out zero.

    Args:
        k_cache, v_cache: (num_blocks, block_size, Hkv, D), float16 or float32, on q's device.
        layout: RowLayout(query_start_loc, seq_lens, q.device).
        block_tables: int (S, max_blocks) on q's device.
        scale, sliding_window (0 = full), softcap (0 = none), sinks (None or f32 (Hq,)): as
        gpu_kernels.attention.paged_attention.
    """
    T, Hq, D = q.shape
    NB, BS, Hkv = k_cache.shape[:3]
    if (Hq % Hkv or k_cache.shape[3] != D or v_cache.shape != k_cache.shape
            or v_cache.stride() != k_cache.stride() or k_cache.stride(3) != 1):
        raise ValueError("paged_attention_rows: q heads / head_dim do not match the KV cache (or its rows are strided)")
    q = q.to(torch.float32).contiguous()
    out = torch.zeros_like(q)
    if layout.num_rows == 0:
        return out
    qr, outr = q[layout.first: layout.first + layout.num_rows], out[layout.first: layout.first + layout.num_rows]
    G = Hq // Hkv
    tables = block_tables.contiguous()
    _paged_rows_kernel[(layout.num_rows, Hkv)](
        qr, k_cache, v_cache, outr, tables, layout.seq, layout.pos,
        qr.stride(0), qr.stride(1), outr.stride(0), outr.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0),
        float(np.float32(scale)), float(softcap), int(sliding_window),
        qr if sinks is None else sinks.to(torch.float32).contiguous(),  # unread without sinks
        G=G, GP=max(16, triton.next_power_of_2(G)), D=D, DP=max(16, triton.next_power_of_2(D)), BS=BS,
        BLOCK_L=BLOCK_L, SOFTCAP=softcap > 0, SINKS=sinks is not None, num_warps=4, enable_fp_fusion=True)
    return out
