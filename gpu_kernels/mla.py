"""The torch twin of engine/model/parts/mla.py (multi-head latent attention, llama.cpp's absorbed form) over the same
latent cache: one (num_blocks, block_size, 1, L + R) array per layer holding [RMSNorm(latent) | roped key], read as
both K and V. Its paged attention is the torch one (the Triton kernel pads D = L + R to a power of two)."""
from __future__ import annotations

import numpy as np
import torch

from gpu_kernels import attention as dattn
from gpu_kernels import ops
from gpu_kernels.modules import DeviceBatch, DeviceContext, vector


class DeviceMLA:
    """leaves: device Linears (or host modules) "q" (q_a, or q without it), "kv_a", "o" and "q_b" (with q_a); k_b,
    v_b: one device Linear per head; KV as DeviceAttention's (the runner's pair, this layer's own device cache, or
    with kv_on_host the runner's numpy cache, attended by cpu_kernels in RAM)."""

    def __init__(self, src, leaves: dict, k_b: list, v_b: list, q_a_norm, kv_a_norm, ctx: DeviceContext,
                 kv_cache=None, kv_on_host: bool = False):
        self.q, self.kv_a, self.o, self.q_b = leaves["q"], leaves["kv_a"], leaves["o"], leaves.get("q_b")
        self.k_b, self.v_b, self.q_a_norm, self.kv_a_norm = k_b, v_b, q_a_norm, kv_a_norm
        self.ctx, self.kv_cache, self.kv_on_host = ctx, kv_cache, kv_on_host
        self.num_heads, self.head_dim, self.rope_dim = src.num_heads, src.head_dim, src.rope_dim
        self.kv_lora, self.value_dim, self.scale, self.mscale = src.kv_lora, src.value_dim, src.scale, src.mscale
        self.inv_freq = vector(src.inv_freq, ctx.device)
        self.rope_key = (np.asarray(src.inv_freq, np.float32).tobytes(), float(src.mscale))

    def __call__(self, x: torch.Tensor, batch: DeviceBatch, kv) -> torch.Tensor:
        t, H, L, R = x.shape[0], self.num_heads, self.kv_lora, self.rope_dim
        q = self.q(x)
        if self.q_b is not None:
            q = self.q_b(self.q_a_norm(q))
        q = q.view(t, H, self.head_dim)
        kva = self.kv_a(x)
        cos, sin = batch.rope(self.rope_key, self.inv_freq, self.mscale)
        row = torch.cat([self.kv_a_norm(kva[:, :L]).view(t, 1, L),
                         ops.apply_rope(kva[:, L:].reshape(t, 1, R), cos, sin, False)], dim=-1)
        nope = self.head_dim - R
        q_abs = torch.stack([self.k_b[h](q[:, h, :nope].contiguous()) for h in range(H)], dim=1)
        q_full = torch.cat([q_abs, ops.apply_rope(q[:, :, nope:], cos, sin, False)], dim=-1)
        if kv is not None and isinstance(kv[0], torch.Tensor):
            cache = kv[0]
        elif self.kv_cache is not None:
            cache = self.kv_cache[0]
        elif self.kv_on_host:
            out = self.ctx.to_device(self._host_attention(q_full, row, batch.meta, kv))
            return self._output(out)
        else:
            raise RuntimeError("DeviceMLA: no KV cache on the device and the layer is not --kv-offload")
        rows = row if batch.rows is None else row.index_select(0, batch.rows)
        dattn.write_rows(rows, cache, batch.slots)
        groups = batch.attention_groups(H, 1, L + R, cache.shape[1])
        out = dattn.paged_attention(q_full, cache, cache, batch.query_start_loc, batch.seq_lens, batch.block_tables,
                                    self.scale, groups=groups)
        return self._output(out)

    def _output(self, out: torch.Tensor) -> torch.Tensor:
        """Each head's latent result through its v_b, then o."""
        L = self.kv_lora
        return self.o(torch.cat([self.v_b[h](out[:, h, :L].contiguous()) for h in range(self.num_heads)], dim=-1))

    def _host_attention(self, q_full, row, meta, kv) -> np.ndarray:
        from cpu_kernels import attention as cattn
        qn, rn = self.ctx.to_host(q_full), self.ctx.to_host(row)
        cache = kv[0]
        cattn.write_kv(rn, rn, cache, cache, np.asarray(meta.slot_mapping, np.int64))  # V is K: one row written twice
        return cattn.paged_attention(qn, cache, cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                     self.scale)
