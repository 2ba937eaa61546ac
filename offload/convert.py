"""Numpy modules of engine/model -> their gpu_kernels twins, following one layer's LayerPlan.

Nothing here knows an architecture or a kind of part: a block is converted step by step (its norms here, each part
by its own Part.to_device, engine/model/parts/), and a part asks this Converter for the leaves it needs (a device
Linear for a tensor, a norm, stacked experts).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from gpu_kernels import modules as dm
from gpu_kernels.dequant import has_device_dequant
from gpu_kernels.linear import DeviceLinear, DeviceWeight, typed_raw


class Converter:
    """Builds device modules for one model on one DeviceContext."""

    def __init__(self, model, ctx: dm.DeviceContext, default_fmt: str = "packed"):
        self.model, self.ctx, self.ws = model, ctx, model.weights
        self.default_fmt = default_fmt  # for tensors of CPU layers overridden onto the device

    # ---- leaves
    def tensor_device(self, lp, name: str) -> str:
        return lp.tensors_elsewhere.get(name, lp.device)

    def linear(self, lin, name: str, lp, fmt: str | None = None, streamed: bool | None = None):
        """A device Linear for tensor `name` (its bias too), or None when the plan keeps it in RAM."""
        if self.tensor_device(lp, name) == "cpu":
            return None
        fmt = fmt or (lp.weight_format if lp.device != "cpu" else self.default_fmt)
        streamed = (lp.weights == "streamed") if streamed is None else streamed
        raw = self.ws.raw(name) if fmt == "packed" else None
        w = DeviceWeight.build(lin.weight, raw, fmt, self.ctx.device, self.ctx.compute_dtype, streamed)
        bias = None if lin.bias is None else dm.vector(lin.bias, self.ctx.device)
        perm = getattr(lin, "in_perm", None)
        return DeviceLinear(w, bias, None if perm is None else torch.from_numpy(perm).to(self.ctx.device))

    def leaf(self, lin, name: str, lp):
        """Inside a device block: a device Linear, or the numpy one run from RAM."""
        d = self.linear(lin, name, lp)
        return d if d is not None else dm.HostModule(lin, self.ctx)

    def norm(self, n):
        return None if n is None else dm.DeviceRMSNorm(n.weight, n.eps, self.ctx.device)

    def stacked_experts(self, names: list[str], weights: list[list], lp, in_perms=None) -> list:
        """(gate, up, down) DeviceLinears per expert from the stacked tensors `names`; weights[j][e]: the CPU
        QuantLinear of projection j of expert e (used where the format is not kept packed on the device);
        in_perms[j]: None, or act-order's input order of each expert (E, K) of projection j."""
        fmt, streamed = lp.weight_format, lp.weights == "streamed"
        per_proj = []
        for j, (name, proj) in enumerate(zip(names, weights)):
            info = self.ws.info(name)
            E, N, K = info.shape
            if fmt == "packed" and has_device_dequant(info.ggml_type):
                data = typed_raw(self.ws.raw(name).reshape(E, N, -1), info.ggml_type)
                if not streamed:
                    data = data.to(self.ctx.device)
                elif self.ctx.device.type == "cuda":
                    data = data.pin_memory()
                per_proj.append([DeviceLinear(DeviceWeight(data[e], "packed", info.ggml_type, N, K, self.ctx.device,
                                                           self.ctx.compute_dtype, streamed)) for e in range(E)])
            else:
                per_proj.append([DeviceLinear(DeviceWeight.build(w, None, fmt, self.ctx.device, self.ctx.compute_dtype,
                                                                 streamed)) for w in proj])
            perm = in_perms[j] if in_perms else None
            if perm is not None:  # each expert gathers its inputs in its stored order, as on the CPU
                for e, lin in enumerate(per_proj[-1]):
                    lin.in_perm = torch.from_numpy(np.ascontiguousarray(perm[e])).to(self.ctx.device)
        return [tuple(proj[e] for proj in per_proj) for e in range(len(per_proj[0]))]

    def as_device(self, lp):
        """The LayerPlan seen from a part moved onto the device: its own tensors there, in the default format."""
        on = {n: d for n, d in lp.tensors_elsewhere.items() if d != "cpu"}
        return replace(lp, device=next(iter(on.values())), weights="device", weight_format=self.default_fmt,
                       kv_device="cpu", tensors_elsewhere={})

    # ---- blocks
    def block(self, blk, layer: int, lp, kv_cache=None):
        """The device twin of a CPU Block (engine/model/block.py), step by step."""
        if not getattr(blk, "rms", True):
            raise NotImplementedError(f"layer {layer}: LayerNorm and post-norm blocks (BERT) run on the CPU only: "
                                      "leave n_gpu_layers at 0")
        steps = [(self.norm(pre), part.to_device(self, lp, kv_cache), self.norm(post))
                 for pre, part, post in zip(blk.pre, blk.parts, blk.post)]
        return dm.DeviceBlock(self.ctx, layer, steps, getattr(blk, "out_scale", None))

    def patch_cpu_block(self, blk, layer: int, lp) -> list[tuple[object, object, object]]:
        """A CPU layer with tensors overridden onto the device: swap those leaves (or whole parts) for OnDevice
        wrappers. Returns (container, attribute or index, old value) for undo."""
        patches = []
        for i, part in enumerate(blk.parts):
            whole = part.override_whole(self, lp)
            if whole is not None:
                patches.append((blk.parts, i, dm.OnDevice(whole, self.ctx)))
            else:
                patches += part.override_patches(self, lp)
        out = []
        for obj, key, new in patches:
            out.append((obj, key, get_item(obj, key)))
            set_item(obj, key, new)
        return out


def get_item(obj, key):
    return obj[key] if isinstance(key, int) else getattr(obj, key)


def set_item(obj, key, value) -> None:
    if isinstance(key, int):
        obj[key] = value
    else:
        setattr(obj, key, value)
