"""Gated DeltaNet linear attention (spec.GatedDeltaNetSpec, qwen3.5): the q|k|v, z, b and a projections (stacked
where they can be), cpu_kernels/delta_net.py's conv + delta rule + gated norm over the layer's state pools, out_proj.

The layer's cache is (conv_pool, ssm_pool), one slot per sequence (BatchMetadata.state_slots); long prefill chunks
run the chunked form of the delta rule (not under batch_invariant, where every row runs token by token)."""
from __future__ import annotations

import numba
import numpy as np

from cpu_kernels.delta_net import gdn_core
from cpu_kernels.delta_rule import CHUNK
from cpu_kernels.quant.threads import serial_work
from engine.model.parts.base import Part, packed_linears
from engine.model.parts.linear import Linear, Projections, vector
from engine.model.spec import GatedDeltaNetSpec

PROJECTIONS = ("qkv", "z", "b", "a")


class GatedDeltaNet(Part):
    def __init__(self, spec: GatedDeltaNetSpec, ws, cfg, prefix: str, batch_invariant: bool, shared: dict):
        self.spec = spec
        self.names = {k: prefix + t + ".weight" for k, t in (("qkv", "attn_qkv"), ("z", "attn_gate"),
                                                             ("b", "ssm_beta"), ("a", "ssm_alpha"), ("out", "ssm_out"))}
        for k, name in self.names.items():
            setattr(self, k, Linear(ws, name, None, batch_invariant))
        C, K = spec.conv_dim, spec.conv_kernel
        conv = vector(ws, prefix + "ssm_conv1d.weight")
        if conv.size != C * K:
            raise ValueError(f"{prefix}ssm_conv1d.weight holds {conv.size} values, not {C} x {K}")
        self.conv_w = np.ascontiguousarray(conv.reshape(C, K).T)  # (K, C): the kernel walks channels innermost
        self.a_neg = np.array(vector(ws, prefix + "ssm_a"))
        self.dt_bias = np.array(vector(ws, prefix + "ssm_dt.bias"))
        self.norm_w = np.array(vector(ws, prefix + "ssm_norm.weight"))
        self.eps = float(cfg.rms_norm_eps)
        self.chunk_min = 0 if batch_invariant else CHUNK  # batch invariant: token by token whatever the chunking
        self.proj = Projections(self, PROJECTIONS)

    def _par(self, t: int) -> bool:
        s = self.spec
        return numba.get_num_threads() > 1 and t * s.num_v_heads * s.k_head_dim * s.v_head_dim >= serial_work()

    def __call__(self, x: np.ndarray, meta, kv) -> np.ndarray:
        rows, s = meta.rows, self.spec
        cols = self.proj.columns(x, rows)
        conv_pool, ssm_pool = kv
        o = gdn_core(*cols, self.conv_w, self.a_neg, self.dt_bias, self.norm_w, self.eps, conv_pool, ssm_pool,
                     meta.query_start_loc, meta.positions, meta.state_slots, meta.snap_rows, meta.snap_slots,
                     s.num_k_heads, s.k_head_dim, s.v_head_dim, self.chunk_min, self._par(x.shape[0]))
        return self.out(o, rows)

    def fused(self):
        from cpu_kernels.decode_block import FusedDeltaNet
        from cpu_kernels.quant.packed import packed
        where = self.proj.where()
        if where is None:
            return None
        groups = [lin for lin, _ in self.proj.groups]
        lins = tuple(groups[g] for g, _ in where) + (self.out,)
        if not packed_linears(lins):
            return None
        first = {}  # group -> the first part reading it
        src = [first.setdefault(g, i) for i, (g, _) in enumerate(where)]
        s = self.spec
        return FusedDeltaNet(
            tuple(packed(lin.weight) for lin in lins), tuple(int(lin.weight.N) for lin in lins),
            tuple(int(lin.weight.nbytes) for lin in lins),
            (src[1], src[2], src[3], *(int(c) for _, c in where), int(s.num_k_heads), int(s.k_head_dim),
             int(s.v_head_dim), int(self.chunk_min)),
            (self.conv_w, self.a_neg, self.dt_bias, self.norm_w), (self.eps,))

    def to_device(self, conv, lp, kv_cache=None):
        from gpu_kernels.delta_net import DeviceGatedDeltaNet
        leaves = {k: conv.leaf(getattr(self, k), name, lp) for k, name in self.names.items()}
        return DeviceGatedDeltaNet(self, leaves, conv.ctx, kv_cache)
