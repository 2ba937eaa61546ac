"""Mixture of experts (spec.MoESpec): a router picks top-k gated experts per token; their outputs are added in
expert order, weighted by the router, plus an optional (gated) shared expert. Routing and adding are
cpu_kernels/moe.py's, shared with the fused step, so both paths give the same bits. Gemma 4: the router may read a
normed, scaled input of its own (router_input), the chosen weights a per-expert scale, and each expert's gate and up
rows may be one stacked matrix (gate_up)."""
from __future__ import annotations

import numpy as np

from cpu_kernels.moe import SCORINGS, add_shared, expert_rows, router_input, scale_chosen
from cpu_kernels.quant.linear import stacked_experts
from cpu_kernels.quant.registry import get_format
from engine.model.parts import mlp
from engine.model.parts.base import Part, packed_linears
from engine.model.parts.linear import Linear, has, vector
from engine.model.parts.norm import NO_NORM
from engine.model.spec import MoESpec

PROJECTIONS = ("gate", "up", "down")
GATE_UP = ("gate_up", "down")  # spec.gate_up: ffn_gate_up_exps holds each expert's gate rows, then its up rows
_NO_BIAS = np.zeros((0, 0), np.float32)


class MoE(Part):
    def __init__(self, spec: MoESpec, ws, cfg, prefix: str, batch_invariant: bool, shared: dict):
        if spec.scoring not in SCORINGS:
            raise ValueError(f"MoE scoring {spec.scoring!r} is not supported ({', '.join(SCORINGS)})")
        if spec.n_group < 1 or spec.num_experts % spec.n_group or not 1 <= spec.topk_group <= spec.n_group:
            raise ValueError(f"MoE groups: {spec.num_experts} experts in {spec.n_group} groups, {spec.topk_group} kept")
        self.spec = spec
        self.names = {"router": prefix + "ffn_gate_inp.weight"}
        self.gate_up = spec.gate_up  # (gate_up, down) per expert instead of (gate, up, down)
        self.expert_names = {k: prefix + f"ffn_{k}_exps.weight" for k in (GATE_UP if spec.gate_up else PROJECTIONS)}
        router_bias = prefix + "ffn_gate_inp.bias" if spec.router_bias else None
        self.router = Linear(ws, self.names["router"], router_bias, batch_invariant)
        self.selection_bias = vector(ws, prefix + "exp_probs_b.bias") if spec.selection_bias else NO_NORM
        self.top_k, self.norm_topk_prob, self.act = spec.top_k, spec.norm_topk_prob, spec.act
        # writable copies: one kernel signature whether the file's pages or a converted array hold them
        self.router_scale = np.array(vector(ws, prefix + "ffn_gate_inp.scale")) if spec.router_input_norm else NO_NORM
        self.router_eps, self.router_root = float(cfg.rms_norm_eps), float(cfg.hidden_size ** -0.5)
        self.expert_scale = np.array(vector(ws, prefix + "ffn_down_exps.scale")) if spec.expert_scale else NO_NORM
        self.stacked, per_proj, self.biases, self.in_perms = [], [], [], []
        for k, name in self.expert_names.items():
            info = ws.info(name)
            self.in_perms.append(ws.in_perm(name))  # act-order experts: (E, K), each expert's input order
            # Repacked copies: the mapped pages may leave RSS as the repack goes
            release = (lambda lo, hi, name=name: ws.release(name, lo, hi)) \
                if get_format(info.ggml_type).repack_copies else None
            arrays, weights = stacked_experts(info.ggml_type, ws.raw(name), info.shape, release)
            self.stacked.append((info.ggml_type, arrays))
            per_proj.append(weights)
            bias = prefix + f"ffn_{k}_exps.bias"
            self.biases.append(_expert_bias(ws, bias, info.shape) if spec.expert_bias else _NO_BIAS)
        # Per expert, its (gate, up, down) Linears over views of the stacked arrays (biases: rows of the stacked ones).
        self.experts = [tuple(Linear.of(w[e], b[e] if b.size else None, batch_invariant, None if p is None else p[e])
                              for w, b, p in zip(per_proj, self.biases, self.in_perms))
                        for e in range(len(per_proj[0]))]
        self.shared = None
        if spec.shared is not None:
            self.shared = mlp.GatedMLP(spec.shared, ws, cfg, prefix, batch_invariant, shared)
        gate = prefix + "ffn_gate_inp_shexp.weight"
        self.shared_gate = vector(ws, gate) if spec.shared_gate and has(ws, gate) else NO_NORM
        if spec.shared_gate and not self.shared_gate.size:
            raise ValueError(f"{gate} is missing")

    def leaves(self) -> tuple:
        return (self.router,) + (self.shared.leaves() if self.shared is not None else ())

    def _route(self, logits: np.ndarray):
        s = self.spec
        ids, weights = expert_rows(logits, self.selection_bias, s.top_k, SCORINGS[s.scoring], s.n_group, s.topk_group,
                                   s.norm_topk_prob, float(s.routed_scale))
        scale_chosen(ids, weights, self.expert_scale)
        return ids, weights

    def __call__(self, x: np.ndarray, meta=None, kv=None, router_x: np.ndarray | None = None) -> np.ndarray:
        """router_x: what the router reads instead of x (Gemma 4 routes on the block's un-normed residual)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows = meta.rows if meta is not None else None
        rin = x if router_x is None else np.ascontiguousarray(router_x, dtype=np.float32)
        if self.router_scale.size:
            rin = router_input(rin, self.router_scale, self.router_eps, self.router_root)
        ids, weights = self._route(self.router(rin, rows))
        kernel = mlp.ACTIVATIONS[self.act][0]
        dense = rows.dense_dtype if rows is not None else "auto"  # float experts' rows: the dense GEMM
        out = np.zeros_like(x)
        for e in np.unique(ids):
            r, slot = np.nonzero(ids == e)
            xe = np.ascontiguousarray(x[r])
            # Quantized experts run their int8 kernel for all their rows: a torch GEMM between two Numba calls per
            # expert makes the two thread pools wait for each other (and a row gets the bits of its decode step).
            if self.gate_up:  # one matmul over gate|up; the activation reads its halves in place
                gu, down = self.experts[e]
                y = gu(xe, per_row=gu.weight.fmt.int8_activations, dense_dtype=dense)
                F = y.shape[1] // 2
                h = kernel(y, 0, y, F, F)
            else:
                gate, up, down = self.experts[e]
                int8 = gate.weight.fmt.int8_activations
                g, u = gate(xe, per_row=int8, dense_dtype=dense), up(xe, per_row=int8, dense_dtype=dense)
                h = kernel(g, 0, u, 0, g.shape[1])
            y = down(h, per_row=down.weight.fmt.int8_activations, dense_dtype=dense)
            out[r] += weights[r, slot][:, None] * y  # rows take their experts in ascending order
        if self.shared is not None:
            add_shared(out, self.shared(x, meta), self.shared_gate, x)
        return out

    def fused(self):
        from cpu_kernels.decode_block import FusedMoE
        from cpu_kernels.quant.packed import PACKED, packed
        if not packed_linears((self.router,)) or any(p is not None for p in self.in_perms):
            return None  # act-order experts gather their inputs: the unfused path
        shared = ()
        if self.shared is not None:
            shared = self.shared.fused()
            if shared is None:
                return None
        s, one = self.spec, self.experts[0]
        experts, biases = tuple(PACKED[t](*arrays) for t, arrays in self.stacked), tuple(self.biases)
        E, H = len(self.experts), one[-1].out_features
        if self.gate_up:  # the step's (gate, up, down) slots: gate|up twice (one GEMV), then down
            one, experts, biases = (one[0], one[0], one[1]), (experts[0], experts[0], experts[1]), (
                _NO_BIAS, _NO_BIAS, biases[1])
        F = one[0].out_features // (2 if self.gate_up else 1)
        router_bias = self.router.bias if self.router.bias is not None else NO_NORM
        return FusedMoE(
            packed(self.router.weight), experts, biases,
            (E, F, H), (int(self.router.weight.nbytes), *(int(lin.weight.nbytes) for lin in one)),
            (int(s.top_k), int(bool(s.norm_topk_prob)), mlp.ACTIVATIONS[self.act][1], SCORINGS[s.scoring],
             int(s.n_group), int(s.topk_group), int(self.gate_up)),
            (float(s.routed_scale),), router_bias, self.selection_bias, shared, self.shared_gate,
            (self.router_scale, self.router_eps, self.router_root), self.expert_scale)

    def experts_on_device(self, conv, lp) -> bool:
        """The plan puts this layer's routed experts on the device (not kept in RAM by an override)."""
        return conv.tensor_device(lp, next(iter(self.expert_names.values()))) != "cpu"

    def to_device(self, conv, lp, kv_cache=None):
        from gpu_kernels.modules import DeviceMoE, HostModule
        if not self.experts_on_device(conv, lp):
            return HostModule(self, conv.ctx)  # experts (and their router) stay in RAM
        router = conv.linear(self.router, self.names["router"], lp, fmt="float32", streamed=False)
        names = list(self.expert_names.values())
        experts = conv.stacked_experts(names, [[e[j].weight for e in self.experts] for j in range(len(names))], lp,
                                       self.in_perms)
        shared = self.shared.to_device(conv, lp) if self.shared is not None else None
        s = self.spec
        return DeviceMoE(router, experts, s.top_k, s.norm_topk_prob, self.act, scoring=s.scoring,
                         selection_bias=self.selection_bias, n_group=s.n_group, topk_group=s.topk_group,
                         routed_scale=s.routed_scale, expert_biases=self.biases if s.expert_bias else None,
                         shared=shared, shared_gate=self.shared_gate,
                         router_in=(self.router_scale, self.router_eps, self.router_root) if self.router_scale.size
                         else None, expert_scale=self.expert_scale if self.expert_scale.size else None)

    def override_patches(self, conv, lp):
        """The router and the shared expert's matrices, one by one (the routed experts move as a whole)."""
        return super().override_patches(conv, lp) + (self.shared.override_patches(conv, lp) if self.shared else [])

    def override_whole(self, conv, lp):
        """exps=GPU inside a CPU layer: the whole MoE (router and experts) runs on the device."""
        if not self.experts_on_device(conv, lp):
            return None
        return self.to_device(conv, conv.as_device(lp), None)


def _expert_bias(ws, name: str, shape) -> np.ndarray:
    """(E, N) float32 biases of a stacked expert tensor (E, N, K)."""
    return np.ascontiguousarray(vector(ws, name).reshape(shape[0], shape[1]))
