"""The gated MLP (spec.GatedMLPSpec): down(act(gate(x)) * up(x)), gate|up stacked into one matmul where they can; and
the plain one (spec.MLPSpec, BERT's): down(gelu(up(x))) with biases."""
from __future__ import annotations

import numpy as np

from cpu_kernels.activations import _gelu_tanh_mul, _silu_mul, _swiglu_oai, gelu
from engine.model.parts.base import Part, packed_linears
from engine.model.parts.linear import Linear, Projections, prefill_scratch
from engine.model.parts.norm import small_on_one_thread
from engine.model.spec import GatedMLPSpec, MLPSpec

# act name -> (kernel over (a, a's first column, b, b's first column, width), its code in decode_block)
ACTIVATIONS = {"silu": (_silu_mul, 0), "gelu_tanh": (_gelu_tanh_mul, 1), "swiglu_oai": (_swiglu_oai, 2)}


class GatedMLP(Part):
    def __init__(self, spec: GatedMLPSpec, ws, cfg, prefix: str, batch_invariant: bool, shared: dict):
        if spec.act not in ACTIVATIONS:
            raise ValueError(f"activation {spec.act!r} is not supported ({', '.join(ACTIVATIONS)})")
        self.names = {k: prefix + n for k, n in spec.names().items()}
        for k, name in self.names.items():
            setattr(self, k, Linear(ws, name, None, batch_invariant))
        self.act = spec.act
        self.gate_up = Projections(self, ("gate", "up"))

    def __call__(self, x: np.ndarray, meta=None, kv=None) -> np.ndarray:
        rows = meta.rows if meta is not None else None
        kernel, width = ACTIVATIONS[self.act][0], self.gate.out_features
        y = self.gate_up.stacked(x, rows)
        if y is not None:  # gate|up in one matmul output: the activation reads its halves in place
            with small_on_one_thread(y):
                h = kernel(y, 0, y, width, width)
        else:
            (g, g0), (u, u0) = self.gate_up.columns(x, rows)
            with small_on_one_thread(g):
                h = kernel(g, g0, u, u0, width)
        return self.down(h, rows)

    def fused(self):
        from cpu_kernels.decode_block import FusedGatedMLP
        from cpu_kernels.quant.packed import packed
        where = self.gate_up.where()
        if where is None:
            return None
        (gg, g0), (gu, u0) = where
        groups = [lin for lin, _ in self.gate_up.groups]
        lins = (groups[gg], groups[gu], self.down)
        if not packed_linears(lins) or any(lin.bias is not None for lin in lins):
            return None
        return FusedGatedMLP(tuple(packed(lin.weight) for lin in lins), tuple(int(lin.weight.N) for lin in lins),
                             tuple(int(lin.weight.nbytes) for lin in lins),
                             (1 if gg == gu else 0, g0, u0, int(self.gate.out_features), ACTIVATIONS[self.act][1]))

    def to_device(self, conv, lp, kv_cache=None):
        from gpu_kernels.modules import DeviceGatedMLP
        leaves = {k: conv.leaf(getattr(self, k), name, lp) for k, name in self.names.items()}
        return DeviceGatedMLP(leaves["gate"], leaves["up"], leaves["down"], self.act)


class MLP(Part):
    def __init__(self, spec: MLPSpec, ws, cfg, prefix: str, batch_invariant: bool, shared: dict):
        if spec.act != "gelu":
            raise ValueError(f"activation {spec.act!r} of a plain MLP is not supported (gelu)")
        self.names = {"up": prefix + "ffn_up.weight", "down": prefix + "ffn_down.weight"}
        for k, name in self.names.items():
            setattr(self, k, Linear(ws, name, name[:-len("weight")] + "bias" if spec.bias else None, batch_invariant))

    def __call__(self, x: np.ndarray, meta=None, kv=None) -> np.ndarray:
        rows = meta.rows if meta is not None else None
        h = np.ascontiguousarray(self.up(x, rows, scratch=prefill_scratch(x, rows, self.up.out_features)),
                                 dtype=np.float32)
        with small_on_one_thread(h):
            gelu(h)
        return self.down(h, rows)

    def fused(self):
        return None  # the fused decode step has no plain-MLP kernel: this block runs its parts one by one

    def to_device(self, conv, lp, kv_cache=None):
        from gpu_kernels.modules import DeviceMLP
        return DeviceMLP(conv.leaf(self.up, self.names["up"], lp), conv.leaf(self.down, self.names["down"], lp))
