"""The torch twin of engine/model/parts/parallel_ffn.py: a dense MLP and a MoE over the same input (Gemma 4)."""
from __future__ import annotations

import torch


class DeviceParallelFFN:
    """mlp_post(mlp(mlp_pre(x))) + moe_post(moe(moe_pre(x), router_x=x)); norms: (mlp_pre, mlp_post, moe_pre,
    moe_post) device RMSNorms. moe: a DeviceMoE, or a HostModule over the CPU MoE when its experts stay in RAM."""

    def __init__(self, mlp, moe, norms):
        self.mlp, self.moe, self.norms = mlp, moe, norms

    def __call__(self, x: torch.Tensor, batch=None, kv=None) -> torch.Tensor:
        mlp_pre, mlp_post, moe_pre, moe_post = self.norms
        m1 = mlp_post(self.mlp(mlp_pre(x), batch))
        return m1 + moe_post(self.moe(moe_pre(x), batch, router_x=x))
