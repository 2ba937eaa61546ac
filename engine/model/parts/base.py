"""What every part of a block offers: its kernel-by-kernel CPU call, the arguments of its fused decode step, and
its torch twin for layers placed on a GPU. A new kind of part is one file beside this one, with all three."""
from __future__ import annotations

import numpy as np


class Part:
    """names: Linear attribute -> the GGUF tensor it was read from (the offload layer moves them by name)."""
    names: dict[str, str] = {}

    def __call__(self, x: np.ndarray, meta, kv) -> np.ndarray:
        """x f32 (T, H) normed input rows of the batch `meta` -> f32 (T, H); kv: the layer's cache."""
        raise NotImplementedError

    def leaves(self) -> tuple:
        """The Linears it runs now (an offload override replaces some: the fused arguments are then stale)."""
        return tuple(getattr(self, k) for k in self.names)

    def fused(self):
        """The named tuple cpu_kernels/decode_block.py runs this part from, or None where its Linears are not all
        CPU weights (an override put one on a device): the block then runs kernel by kernel."""
        raise NotImplementedError

    def to_device(self, conv, lp, kv_cache):
        """Its gpu_kernels module for a layer placed on conv's device (offload/convert.py's Converter; lp: the
        layer's LayerPlan; kv_cache: the layer's device KV or None)."""
        raise NotImplementedError

    def override_whole(self, conv, lp):
        """A device module replacing the whole part when an override moves it as one (MoE experts), else None."""
        return None

    def override_patches(self, conv, lp) -> list[tuple[object, str, object]]:
        """(object, attribute, new value) for the tensors of this part an override puts on the device inside a
        CPU layer: each such Linear runs on the device from RAM-side code."""
        from gpu_kernels.modules import OnDevice
        on_dev = {n for n, d in lp.tensors_elsewhere.items() if d != "cpu"}
        return [(self, k, OnDevice(conv.linear(getattr(self, k), name, lp), conv.ctx))
                for k, name in self.names.items() if name in on_dev]


def packed_linears(lins) -> bool:
    """Every one a CPU Linear over a registered format (not a device module swapped in by an override) reading its
    inputs in their own order (the fused kernels do not gather act-order inputs)."""
    from cpu_kernels.quant.packed import PACKED
    from engine.model.parts.linear import Linear
    return all(type(lin) is Linear and lin.weight.ggml_type in PACKED and lin.in_perm is None for lin in lins)
