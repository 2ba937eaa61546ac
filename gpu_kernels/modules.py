"""Layer modules on a torch device, with the call signatures of engine/model's numpy ones.

A block takes (x, meta, kv) like the CPU blocks: x is a numpy (T, H) float32 array or, between two
blocks on the same device, the previous block's tensor (hidden states cross devices only at the
boundaries: the last block of a run on the device returns numpy). Sub-modules take and return float32
tensors on the device; HostModule runs a numpy module (weights kept in RAM by an override) inside a
device block, OnDevice runs a device module inside a CPU block.
"""
from __future__ import annotations

import numpy as np
import torch

from gpu_kernels import attention as dattn
from gpu_kernels import ops, triton_dispatch


def vector(a, device) -> torch.Tensor:
    """A small float32 weight (norm, bias, inv_freq) copied onto the device."""
    return torch.from_numpy(np.array(a, dtype=np.float32)).to(device)


class DeviceContext:
    """One torch device: its compute dtype, host<->device transfers, and the current step's metadata
    uploaded once for all the layers on it."""

    def __init__(self, device: torch.device | str, compute_dtype: torch.dtype = torch.float32):
        self.device = torch.device(device)
        self.compute_dtype = compute_dtype
        self._meta = None
        self._batch = None
        self._staging: torch.Tensor | None = None  # pinned host buffer for uploads (CUDA)
        self._staged = None                        # event of the last upload from it

    # ---- transfers
    def to_device(self, x) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x if x.device == self.device else x.to(self.device, torch.float32)
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        if self.device.type == "cpu":
            return t
        if self.device.type != "cuda":
            return t.to(self.device)
        # CUDA: through a reused pinned buffer, so the copy is a DMA that does not page-lock per call.
        n = t.numel()
        if self._staging is None or self._staging.numel() < n:
            self._staging = torch.empty(max(n, 1 << 16), dtype=torch.float32, pin_memory=True)
        elif self._staged is not None:
            self._staged.synchronize()  # the previous upload from the buffer has finished
        buf = self._staging[:n]
        buf.copy_(t.reshape(-1))
        out = buf.to(self.device, non_blocking=True).view(t.shape)
        self._staged = torch.cuda.Event()
        self._staged.record()
        return out

    @staticmethod
    def to_host(t) -> np.ndarray:
        if isinstance(t, np.ndarray):
            return t
        return np.ascontiguousarray(t.detach().to(torch.float32).cpu().numpy())

    def batch(self, meta) -> "DeviceBatch":
        """The step's metadata on this device; each cache group's view of one step (its own block tables and
        slots, the same step_cache) is uploaded once per step too."""
        if self._meta is None or meta.step_cache is not self._meta:
            self._meta, self._batch = meta.step_cache, {}
        if id(meta) not in self._batch:
            self._batch[id(meta)] = (meta, DeviceBatch(meta, self.device))  # meta kept: its id stays unique
        return self._batch[id(meta)][1]


class DeviceBatch:
    """BatchMetadata on a device: positions, KV slots and block tables as tensors (uploaded once per
    step), the sequence layout kept on the host, and RoPE tables computed once per (inv_freq, mscale)."""

    def __init__(self, meta, device: torch.device):
        self.meta = meta
        self.device = device
        self.positions = torch.as_tensor(np.asarray(meta.positions, np.int64), device=device)
        slots = np.asarray(meta.slot_mapping, np.int64)
        keep = slots >= 0
        self.rows = None if keep.all() else torch.as_tensor(np.flatnonzero(keep), device=device)
        self.slots = torch.as_tensor(slots[keep], device=device)
        self.block_tables = torch.as_tensor(np.asarray(meta.block_tables, np.int64), device=device)
        self.query_start_loc = np.asarray(meta.query_start_loc)
        self.seq_lens = np.asarray(meta.seq_lens)
        self.decode = bool((np.diff(self.query_start_loc) <= 1).all())  # one query row per sequence at most
        self._rope: dict = {}  # per-step caches: RoPE tables, attention groups, the Triton row layout

    def attention_groups(self, Hq: int, Hkv: int, D: int, block_size: int) -> list:
        key = ("attn", Hq, Hkv, D, block_size)
        if key not in self._rope:
            self._rope[key] = dattn.plan_groups(self.query_start_loc, self.seq_lens, Hq, Hkv, D, block_size,
                                                self.device)
        return self._rope[key]

    def row_layout(self):
        if "rows" not in self._rope:
            from gpu_kernels.triton_attention import RowLayout
            self._rope["rows"] = RowLayout(self.query_start_loc, self.seq_lens, self.device)
        return self._rope["rows"]

    def rope(self, key, inv_freq: torch.Tensor, mscale: float):
        if key not in self._rope:
            self._rope[key] = ops.rope_cos_sin(self.positions, inv_freq, mscale)
        return self._rope[key]


class DeviceRMSNorm:
    def __init__(self, weight: np.ndarray, eps: float, device: torch.device):
        self.weight = vector(weight, device)
        self.eps = float(eps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class DeviceGatedMLP:
    def __init__(self, gate, up, down, act: str):
        self.gate, self.up, self.down = gate, up, down
        self.act = ops.ACTIVATIONS[act]

    def __call__(self, x: torch.Tensor, batch=None, kv=None) -> torch.Tensor:
        return self.down(self.act(self.gate(x), self.up(x)))


class DeviceMLP:
    """down(gelu(up(x))), the exact (erf) GELU; the leaves carry their biases."""

    def __init__(self, up, down):
        self.up, self.down = up, down

    def __call__(self, x: torch.Tensor, batch=None, kv=None) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class DeviceMoE:
    """Router -> top-k experts per token (ties to the lower id, as the CPU MoE) -> weighted sum, plus the shared
    expert. scoring softmax | sigmoid | topk_softmax; selection_bias joins the choice only; n_group/topk_group
    limit the choice to the best groups; expert_biases: (gate, up, down) (E, N) arrays or None. Gemma 4: router_in
    (scale (H,), eps, root): the router reads RMSNorm(x) (no weight) * scale * root; expert_scale (E,) multiplies the
    chosen weights; experts of two Linears are (gate|up stacked, down)."""

    def __init__(self, router, experts: list, top_k: int, norm_topk_prob: bool, act: str = "silu",
                 scoring: str = "softmax", selection_bias=None, n_group: int = 1, topk_group: int = 1,
                 routed_scale: float = 1.0, expert_biases=None, shared=None, shared_gate=None, router_in=None,
                 expert_scale=None):
        self.router, self.experts, self.top_k, self.norm_topk_prob = router, experts, top_k, norm_topk_prob
        self.act, self.scoring = ops.ACTIVATIONS[act], scoring
        self.selection_bias = selection_bias if selection_bias is not None and len(selection_bias) else None
        self.n_group, self.topk_group, self.routed_scale = n_group, topk_group, routed_scale
        self.expert_biases = expert_biases
        self.shared = shared
        self.shared_gate = shared_gate if shared_gate is not None and len(shared_gate) else None
        self.router_in, self.expert_scale = router_in, expert_scale
        self._moved = False

    def _to(self, device) -> None:
        """Small routing vectors follow the activations' device on first use."""
        if self._moved:
            return
        as_t = lambda a: torch.as_tensor(np.array(a, np.float32), device=device)  # noqa: E731
        if self.selection_bias is not None:
            self.selection_bias = as_t(self.selection_bias)
        if self.shared_gate is not None:
            self.shared_gate = as_t(self.shared_gate)
        if self.expert_biases is not None:
            self.expert_biases = [as_t(b) for b in self.expert_biases]
        if self.router_in is not None:
            scale, eps, root = self.router_in
            self.router_in = (DeviceRMSNorm(np.ones(len(scale), np.float32), eps, device), as_t(scale), float(root))
        if self.expert_scale is not None:
            self.expert_scale = as_t(self.expert_scale)
        self._moved = True

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.scoring == "softmax":
            probs = torch.softmax(logits, dim=1)
        elif self.scoring == "sigmoid":
            probs = torch.sigmoid(logits)
        else:
            probs = logits
        sel = probs if self.selection_bias is None else probs + self.selection_bias
        if self.n_group > 1:
            T, E = sel.shape
            groups = sel.view(T, self.n_group, E // self.n_group).topk(2, dim=-1).values.sum(-1)
            keep = torch.sort(groups, dim=1, descending=True, stable=True).indices[:, : self.topk_group]
            mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, keep, True)
            sel = sel.masked_fill(~mask.repeat_interleave(E // self.n_group, dim=1), float("-inf"))
        top = torch.sort(sel, dim=1, descending=True, stable=True).indices[:, : self.top_k]
        weights = probs.gather(1, top)
        if self.scoring == "topk_softmax":
            weights = torch.softmax(weights, dim=1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=1, keepdim=True)
        weights = weights * self.routed_scale
        if self.expert_scale is not None:
            weights = weights * self.expert_scale[top]
        return top, weights

    def __call__(self, x: torch.Tensor, batch=None, kv=None, router_x=None) -> torch.Tensor:
        """router_x: what the router reads instead of x (Gemma 4 routes on the block's un-normed residual)."""
        self._to(x.device)
        r = x if router_x is None else router_x
        if self.router_in is not None:
            norm, scale, root = self.router_in
            r = (norm(r) * scale) * root
        top, weights = self.route(self.router(r))
        out = torch.zeros_like(x)
        top_np = top.cpu().numpy()  # one sync: which experts run is decided on the host
        for e in np.unique(top_np):
            rows, slot = np.nonzero(top_np == e)
            rows_t = torch.as_tensor(rows, device=x.device)
            xe = x.index_select(0, rows_t)
            if len(self.experts[e]) == 2:  # gate|up stacked
                gate_up, down = self.experts[e]
                g, u = gate_up(xe).chunk(2, dim=1)
            else:
                gate, up, down = self.experts[e]
                g, u = gate(xe), up(xe)
            if self.expert_biases is not None:
                g, u = g + self.expert_biases[0][e], u + self.expert_biases[1][e]
            y = down(self.act(g, u))
            if self.expert_biases is not None:
                y = y + self.expert_biases[2][e]
            out.index_add_(0, rows_t, weights[rows_t, torch.as_tensor(slot, device=x.device)][:, None] * y)
        if self.shared is not None:
            y = self.shared(x)
            if self.shared_gate is not None:
                y = torch.sigmoid(x @ self.shared_gate)[:, None] * y
            out = out + y
        return out


class DeviceAttention:
    """Attention of one layer on the device. KV: the runner's pair when it holds tensors, else this
    layer's own device cache, else (kv_on_host: --kv-offload) the runner's numpy cache, with write_kv and
    paged attention run by cpu_kernels in RAM, as llama.cpp does for its -nkvo. Decode batches run the
    Triton kernel where triton_dispatch allows it; prefill chunks the torch one, which batches their rows.
    v None: V is the raw k projection (k_eq_v). A layer reading an earlier layer's K/V (src.shared_kv) computes q
    only and writes nothing: over that layer's device cache (kv_cache) or, where it is in RAM, the numpy one."""

    def __init__(self, src, q, k, v, o, q_norm, k_norm, ctx: DeviceContext, kv_cache=None, kv_on_host=False):
        self.q, self.k, self.v, self.o, self.q_norm, self.k_norm = q, k, v, o, q_norm, k_norm
        self.ctx = ctx
        self.num_heads, self.num_kv_heads, self.head_dim = src.num_heads, src.num_kv_heads, src.head_dim
        self.scale, self.sliding_window, self.softcap = src.scale, src.sliding_window, src.softcap
        self.neox, self.mscale = src.neox, src.mscale
        self.output_gate = getattr(src, "output_gate", False)  # q_proj yields [q_h | gate_h] per head
        self.inv_freq = vector(src.inv_freq, ctx.device)
        self.rope_key = (np.asarray(src.inv_freq, np.float32).tobytes(), float(src.mscale))
        self.kv_cache = kv_cache
        self.kv_on_host = kv_on_host
        self.shared_kv = getattr(src, "shared_kv", False)
        vn = getattr(src, "v_norm", None)
        self.v_norm = DeviceRMSNorm(vn[0], vn[1], ctx.device) if vn is not None else None
        self.host_sinks = src.sinks  # f32 (Hq,) attention-sink logits or None
        self.sinks = vector(src.sinks, ctx.device) if src.sinks is not None else None

    def _kv(self, x: torch.Tensor, t: int, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's K (normed, rotated) and V (normed) rows."""
        hkv, d = self.num_kv_heads, self.head_dim
        k_raw = self.k(x)
        k = k_raw.view(t, hkv, d)
        v = (self.v(x) if self.v is not None else k_raw).view(t, hkv, d)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        return ops.apply_rope(k, cos, sin, self.neox), v

    def __call__(self, x: torch.Tensor, batch: DeviceBatch, kv) -> torch.Tensor:
        t, hq, d = x.shape[0], self.num_heads, self.head_dim
        gate = None
        if self.output_gate:
            qg = self.q(x).view(t, hq, 2 * d)
            q, gate = qg[..., :d], qg[..., d:].reshape(t, hq * d)
        else:
            q = self.q(x).view(t, hq, d)
        if self.q_norm is not None:
            q = self.q_norm(q)
        cos, sin = batch.rope(self.rope_key, self.inv_freq, self.mscale)
        q = ops.apply_rope(q, cos, sin, self.neox)
        k, v = (None, None) if self.shared_kv else self._kv(x, t, cos, sin)
        if kv is not None and isinstance(kv[0], torch.Tensor):
            k_cache, v_cache = kv
        elif self.kv_cache is not None:
            k_cache, v_cache = self.kv_cache
        elif self.kv_on_host or self.shared_kv:
            return self.o(self._gated(self.ctx.to_device(self._host_attention(q, k, v, batch.meta, kv)), gate))
        else:
            raise RuntimeError("DeviceAttention: no KV cache on the device and the layer is not --kv-offload")
        if not self.shared_kv:
            if batch.rows is not None:
                k, v = k.index_select(0, batch.rows), v.index_select(0, batch.rows)
            dattn.write_kv(k, v, k_cache, v_cache, batch.slots)
        if batch.decode and k_cache.dtype in (torch.float16, torch.float32):  # one-byte caches: the torch path
            out = triton_dispatch.run("paged_attention", q.device, lambda: self._triton(q, k_cache, v_cache, batch),
                                      lambda: self._torch(q, k_cache, v_cache, batch))
        else:
            out = self._torch(q, k_cache, v_cache, batch)
        return self.o(self._gated(out.reshape(t, hq * d), gate))

    @staticmethod
    def _gated(out: torch.Tensor, gate) -> torch.Tensor:
        return out if gate is None else out * (1.0 / (1.0 + torch.exp(-gate)))

    def _torch(self, q, k_cache, v_cache, batch: DeviceBatch) -> torch.Tensor:
        groups = batch.attention_groups(self.num_heads, self.num_kv_heads, self.head_dim, k_cache.shape[1])
        return dattn.paged_attention(q, k_cache, v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables,
                                     self.scale, self.sliding_window, self.softcap, groups=groups, sinks=self.sinks)

    def _triton(self, q, k_cache, v_cache, batch: DeviceBatch) -> torch.Tensor:
        from gpu_kernels.triton_attention import paged_attention_rows
        return paged_attention_rows(q, k_cache, v_cache, batch.row_layout(), batch.block_tables, self.scale,
                                    self.sliding_window, self.softcap, sinks=self.sinks)

    def _host_attention(self, q, k, v, meta, kv) -> np.ndarray:
        from cpu_kernels import attention as cattn
        to_host = self.ctx.to_host
        k_cache, v_cache = kv
        qn = to_host(q)
        if k is not None:  # a layer reading an earlier layer's K/V writes none
            cattn.write_kv(to_host(k), to_host(v), k_cache, v_cache, meta.slot_mapping)
        out = cattn.paged_attention(qn, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                    self.scale, self.sliding_window, self.softcap, sinks=self.host_sinks)
        return out.reshape(q.shape[0], -1)


class _DeviceBlock:
    output_to_host = True  # the apply step clears it when the next block runs on the same device

    def __init__(self, ctx: DeviceContext, layer: int):
        self.ctx, self.layer = ctx, layer

    def __call__(self, x, meta, kv):
        with torch.no_grad():
            h = self.forward(self.ctx.to_device(x), self.ctx.batch(meta), kv)
        return self.ctx.to_host(h) if self.output_to_host else h


class DeviceBlock(_DeviceBlock):
    """A layer's residual steps x = x + post(part(pre(x))) on the device, in the order of the CPU block it
    replaces (engine/model/block.py): steps are (pre norm or None, part, post norm or None)."""

    def __init__(self, ctx, layer, steps, out_scale=None):
        super().__init__(ctx, layer)
        self.steps = steps
        self.out_scale = None if out_scale is None else vector(out_scale, ctx.device)  # (1,): Gemma 4's layer scalar

    @property
    def parts(self) -> list:
        return [part for _, part, _ in self.steps]

    def forward(self, h, batch, kv):
        for pre, part, post in self.steps:
            y = part(pre(h) if pre is not None else h, batch, kv)
            h = h + (post(y) if post is not None else y)
        return h if self.out_scale is None else h * self.out_scale


class HostModule:
    """A numpy module (x -> y) run from a device block: its weights stay in RAM (--override-tensor)."""

    def __init__(self, module, ctx: DeviceContext):
        self.module, self.ctx = module, ctx

    def __call__(self, x: torch.Tensor, batch=None, kv=None, **kw) -> torch.Tensor:
        kw = {k: self.ctx.to_host(v) for k, v in kw.items()}  # tensors the part takes besides x (a MoE's router_x)
        return self.ctx.to_device(self.module(self.ctx.to_host(x), **kw))


class OnDevice:
    """A device module (x -> y) run from a CPU block: numpy in, numpy out. Takes a Linear's `rows` and `per_row`
    (every row is computed the same way on the device anyway) and a part's (meta, kv), and ignores them."""

    def __init__(self, module, ctx: DeviceContext):
        self.module, self.ctx = module, ctx

    def __call__(self, x, rows=None, per_row: bool = False, **_):
        with torch.no_grad():
            return self.ctx.to_host(self.module(self.ctx.to_device(x)))
