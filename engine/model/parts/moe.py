"""Mixture of experts (spec.MoESpec): a softmax router picks top-k gated experts per token; their outputs are added
in expert order, weighted by the router. Routing and adding are cpu_kernels/moe.py's, shared with the fused step."""
from __future__ import annotations

import numpy as np

from cpu_kernels.moe import expert_rows
from cpu_kernels.quant.linear import stacked_experts
from engine.model.parts.base import Part, packed_linears
from engine.model.parts.linear import Linear
from engine.model.parts import mlp
from engine.model.spec import MoESpec

PROJECTIONS = ("gate", "up", "down")


class MoE(Part):
    def __init__(self, spec: MoESpec, ws, cfg, prefix: str, batch_invariant: bool, shared: dict):
        self.names = {"router": prefix + "ffn_gate_inp.weight"}
        self.expert_names = {k: prefix + f"ffn_{k}_exps.weight" for k in PROJECTIONS}
        self.router = Linear(ws, self.names["router"], None, batch_invariant)
        self.top_k, self.norm_topk_prob, self.act = spec.top_k, spec.norm_topk_prob, spec.act
        self.stacked, per_proj = [], []
        for name in self.expert_names.values():
            info = ws.info(name)
            arrays, weights = stacked_experts(info.ggml_type, ws.raw(name), info.shape)
            self.stacked.append((info.ggml_type, arrays))
            per_proj.append(weights)
            if weights[0].fmt.repack_copies:
                ws.release(name)  # repacked: the mapped pages may leave RSS
        # Per expert, its (gate, up, down) Linears over views of the stacked arrays.
        self.experts = [tuple(Linear.of(w[e], None, batch_invariant) for w in per_proj)
                        for e in range(len(per_proj[0]))]

    def __call__(self, x: np.ndarray, meta=None, kv=None) -> np.ndarray:
        ids, weights = expert_rows(self.router(x, meta.rows if meta is not None else None), self.top_k,
                                   self.norm_topk_prob)
        kernel = mlp.ACTIVATIONS[self.act][0]
        out = np.zeros_like(x)
        for e in np.unique(ids):
            rows, slot = np.nonzero(ids == e)
            gate, up, down = self.experts[e]
            xe = np.ascontiguousarray(x[rows])
            g, u = gate(xe), up(xe)
            y = down(kernel(g, 0, u, 0, g.shape[1]))
            out[rows] += weights[rows, slot][:, None] * y  # rows take their experts in ascending order
        return out

    def fused(self):
        from cpu_kernels.decode_block import FusedMoE
        from cpu_kernels.quant.packed import PACKED, packed
        if not packed_linears((self.router,)) or self.router.bias is not None:
            return None
        one = self.experts[0]
        E, F, H = len(self.experts), one[0].out_features, one[2].out_features
        return FusedMoE(packed(self.router.weight), tuple(PACKED[t](*arrays) for t, arrays in self.stacked),
                        (E, F, H), (int(self.router.weight.nbytes), *(int(lin.weight.nbytes) for lin in one)),
                        (int(self.top_k), int(bool(self.norm_topk_prob)), mlp.ACTIVATIONS[self.act][1]))

    def to_device(self, conv, lp, kv_cache=None):
        from gpu_kernels.modules import DeviceMoE, HostModule
        if conv.tensor_device(lp, self.expert_names["gate"]) == "cpu":
            return HostModule(self, conv.ctx)  # experts (and their router) stay in RAM
        router = conv.linear(self.router, self.names["router"], lp, fmt="float32", streamed=False)
        experts = conv.stacked_experts([self.expert_names[k] for k in PROJECTIONS],
                                       [[e[j].weight for e in self.experts] for j in range(3)], lp)
        return DeviceMoE(router, experts, self.top_k, self.norm_topk_prob, self.act)

    def override_whole(self, conv, lp):
        """exps=GPU inside a CPU layer: the whole MoE (router and experts) runs on the device."""
        if conv.tensor_device(lp, self.expert_names["gate"]) == "cpu":
            return None
        return self.to_device(conv, conv.as_device(lp), None)
