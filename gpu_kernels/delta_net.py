"""The Gated DeltaNet layer on a torch device: the twin of engine/model/parts/delta_net.py over the same state layout
(cpu_kernels/delta_net.py's docstring: conv_pool (slots, K - 1, C), ssm_pool (slots, Hv, dk, dv), value head h
reading key head h % Hk, zero states for a sequence starting at position 0, snapshots after snap_rows rows).

The pools are the runner's (numpy, in RAM) or device tensors the placement allocated: each sequence's slot is read
into a device tensor, run, and written back, so either works. Long chunks run the chunked form of the delta rule
(transformers' torch_chunk_gated_delta_rule, one sequence at a time), short ones token by token.
"""
from __future__ import annotations

import numpy as np
import torch

from gpu_kernels import ops
from gpu_kernels.modules import vector

CHUNK = 64


def _read(pool, slot: int, device) -> torch.Tensor:
    if isinstance(pool, np.ndarray):
        return torch.from_numpy(np.array(pool[slot])).to(device)
    return pool[slot].to(device, torch.float32)


def _write(pool, slot: int, value: torch.Tensor) -> None:
    if isinstance(pool, np.ndarray):
        pool[slot] = value.detach().to("cpu", torch.float32).numpy()
    else:
        pool[slot] = value.to(pool.device, pool.dtype)


def unit(x: torch.Tensor) -> torch.Tensor:
    """transformers' l2norm over the last axis: x / sqrt(sum x^2 + 1e-6)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def recurrent(S, q, k, v, beta, g):
    """Token by token. S (Hv, dk, dv) is updated in place; q, k (n, Hv, dk), v (n, Hv, dv), beta, g (n, Hv)
    -> o (n, Hv, dv)."""
    out = []
    for t in range(q.shape[0]):
        S.mul_(torch.exp(g[t])[:, None, None])
        kv = (S * k[t][:, :, None]).sum(1)
        d = (v[t] - kv) * beta[t][:, None]
        S.add_(k[t][:, :, None] * d[:, None, :])
        out.append((S * q[t][:, :, None]).sum(1))
    return torch.stack(out)


def chunked(S, q, k, v, beta, g):
    """The chunked form over chunks of CHUNK tokens (the last padded with zeros, which leave S unchanged): the same
    contract as recurrent()."""
    n = q.shape[0]
    pad = (-n) % CHUNK
    q, k, v = (torch.nn.functional.pad(x.transpose(0, 1), (0, 0, 0, pad)) for x in (q, k, v))  # (Hv, n + pad, d)
    beta, g = (torch.nn.functional.pad(x.transpose(0, 1), (0, pad)) for x in (beta, g))
    H, N = q.shape[0], q.shape[1] // CHUNK
    q, k, v = (x.reshape(H, N, CHUNK, -1) for x in (q, k, v))
    beta, g = beta.reshape(H, N, CHUNK), g.reshape(H, N, CHUNK)
    gam = g.cumsum(-1)
    mask = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
    decay = (gam[..., :, None] - gam[..., None, :]).masked_fill(mask, float("-inf")).exp()
    kb, vb = k * beta[..., None], v * beta[..., None]
    system = ((kb @ k.transpose(-1, -2)) * decay).tril(-1)
    eye = torch.eye(CHUNK, device=q.device)
    u = torch.linalg.solve_triangular(eye + system, vb, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(eye + system, kb * gam.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay
    qe, kd = q * gam.exp()[..., None], k * (gam[..., -1:] - gam).exp()[..., None]
    out = torch.empty_like(v)
    for i in range(N):
        vn = u[:, i] - w[:, i] @ S
        out[:, i] = qe[:, i] @ S + attn[:, i] @ vn
        S.mul_(gam[:, i, -1].exp()[:, None, None]).add_(kd[:, i].transpose(-1, -2) @ vn)
    return out.reshape(H, N * CHUNK, -1)[:, :n].transpose(0, 1)


class DeviceGatedDeltaNet:
    """leaves: device Linears (or HostModules) for qkv, z, b, a, out; kv_cache: the layer's device state pools or
    None (the runner's pools then come as kv)."""

    def __init__(self, src, leaves: dict, ctx, kv_cache=None):
        s = src.spec
        self.qkv, self.z, self.b, self.a, self.out = (leaves[k] for k in ("qkv", "z", "b", "a", "out"))
        self.Hk, self.Hv, self.dk, self.dv = s.num_k_heads, s.num_v_heads, s.k_head_dim, s.v_head_dim
        self.conv_w = vector(src.conv_w, ctx.device)  # (K, C)
        self.a_neg, self.dt_bias = vector(src.a_neg, ctx.device), vector(src.dt_bias, ctx.device)
        self.norm_w, self.eps = vector(src.norm_w, ctx.device), src.eps
        self.chunk_min = src.chunk_min
        self.ctx, self.kv_cache = ctx, kv_cache

    def __call__(self, x: torch.Tensor, batch, kv=None) -> torch.Tensor:
        conv_pool, ssm_pool = self.kv_cache if self.kv_cache is not None else kv
        meta, dev = batch.meta, x.device
        y, z = self.qkv(x), self.z(x)
        beta = torch.sigmoid(self.b(x))
        g = self.a_neg * torch.nn.functional.softplus(self.a(x) + self.dt_bias)
        K, C = self.conv_w.shape
        kd, heads = self.Hk * self.dk, torch.arange(self.Hv, device=dev) % self.Hk
        o = torch.empty((x.shape[0], self.Hv, self.dv), dtype=torch.float32, device=dev)
        qsl = np.asarray(meta.query_start_loc)
        for s in range(len(qsl) - 1):
            t0, t1 = int(qsl[s]), int(qsl[s + 1])
            if t1 == t0:
                continue
            slot, r, snap = int(meta.state_slots[s]), int(meta.snap_rows[s]), int(meta.snap_slots[s])
            fresh = int(meta.positions[t0]) == 0
            hist = torch.zeros((K - 1, C), device=dev) if fresh else _read(conv_pool, slot, dev)
            xin = torch.cat([hist, y[t0:t1]])
            n = t1 - t0
            conv = sum(self.conv_w[j] * xin[j:j + n] for j in range(K))
            conv = conv / (1.0 + torch.exp(-conv))
            if 0 < r <= n:
                _write(conv_pool, snap, xin[r:r + K - 1])
            _write(conv_pool, slot, xin[n:n + K - 1])
            q = unit(conv[:, :kd].view(n, self.Hk, self.dk))[:, heads] * (self.dk ** -0.5)
            k = unit(conv[:, kd:2 * kd].view(n, self.Hk, self.dk))[:, heads]
            v = conv[:, 2 * kd:].reshape(n, self.Hv, self.dv)
            S = torch.zeros((self.Hv, self.dk, self.dv), device=dev) if fresh else _read(ssm_pool, slot, dev)
            run = chunked if self.chunk_min and n >= self.chunk_min else recurrent
            cut = r if 0 < r < n else n
            parts = [run(S, q[:cut], k[:cut], v[:cut], beta[t0:t0 + cut], g[t0:t0 + cut])]
            if 0 < r <= n:
                _write(ssm_pool, snap, S)
            if cut < n:
                parts.append(run(S, q[cut:], k[cut:], v[cut:], beta[t0 + cut:t1], g[t0 + cut:t1]))
            _write(ssm_pool, slot, S)
            o[t0:t1] = torch.cat(parts)
        zg = z.view(-1, self.Hv, self.dv)
        o = ops.rms_norm(o, self.norm_w, self.eps) * (zg / (1.0 + torch.exp(-zg)))
        return self.out(o.reshape(x.shape[0], self.Hv * self.dv))
