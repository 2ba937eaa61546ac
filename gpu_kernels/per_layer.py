"""The torch twin of engine/model/parts/per_layer.py's PerLayerInput (Gemma 4's per-layer embedding step)."""
from __future__ import annotations

import torch

from gpu_kernels import ops


class DevicePerLayerInput:
    """x -> proj(act(gate(x)) * e): e this layer's rows of the step's per-layer embeddings, which the CPU decoder
    computed before the layers (meta.step_cache[key], f32 (T, layers, P))."""

    def __init__(self, gate, proj, layer: int, act: str, key: str):
        self.gate, self.proj, self.layer, self.key = gate, proj, layer, key
        self.act = ops.ACTIVATIONS[act]

    def __call__(self, x: torch.Tensor, batch, kv=None) -> torch.Tensor:
        e = torch.from_numpy(batch.meta.step_cache[self.key][:, self.layer].copy()).to(x.device)
        return self.proj(self.act(self.gate(x), e))
