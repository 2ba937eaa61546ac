"""A dense MLP and a MoE side by side over the same input (spec.ParallelFFNSpec, Gemma 4's 26B-A4B): each behind its
own pre- and post-norm, their outputs added; the MoE's router reads the un-normed input. Built from the GatedMLP and
MoE parts, whose kernels (and fused steps) it runs."""
from __future__ import annotations

import numpy as np

from engine.model.parts.base import Part
from engine.model.parts.mlp import GatedMLP
from engine.model.parts.moe import MoE
from engine.model.parts.norm import RMSNorm


class ParallelFFN(Part):
    def __init__(self, spec, ws, cfg, prefix: str, batch_invariant: bool, shared: dict):
        self.mlp = GatedMLP(spec.mlp, ws, cfg, prefix, batch_invariant, shared)
        self.moe = MoE(spec.moe, ws, cfg, prefix, batch_invariant, shared)
        self.norms = [RMSNorm(ws, prefix + n + ".weight", cfg.rms_norm_eps) for n in spec.norms]
        self.names = {}  # its Linears live in the two parts

    def leaves(self) -> tuple:
        return self.mlp.leaves() + self.moe.leaves()

    def __call__(self, x: np.ndarray, meta=None, kv=None) -> np.ndarray:
        mlp_pre, mlp_post, moe_pre, moe_post = self.norms
        m1 = mlp_post(self.mlp(mlp_pre(x), meta))
        m2 = moe_post(self.moe(moe_pre(x), meta, router_x=x))
        return m1 + m2

    def fused(self):
        from cpu_kernels.decode_block import FusedParallelFFN
        mlp, moe = self.mlp.fused(), self.moe.fused()
        if mlp is None or moe is None or len({n.eps for n in self.norms}) != 1:
            return None
        return FusedParallelFFN(mlp, moe, tuple(np.ascontiguousarray(n.weight) for n in self.norms),
                                float(self.norms[0].eps))

    def to_device(self, conv, lp, kv_cache=None):
        from gpu_kernels.parallel_ffn import DeviceParallelFFN
        return DeviceParallelFFN(self.mlp.to_device(conv, lp), self.moe.to_device(conv, lp),
                                 [conv.norm(n) for n in self.norms])

    def override_patches(self, conv, lp):
        """The MLP's matrices, and the MoE's router (its experts move as a whole: override_whole)."""
        return self.mlp.override_patches(conv, lp) + self.moe.override_patches(conv, lp)

    def override_whole(self, conv, lp):
        """exps=GPU inside a CPU layer: the whole part (MLP, router and experts) runs on the device."""
        if not self.moe.experts_on_device(conv, lp):
            return None
        return self.to_device(conv, conv.as_device(lp), None)
