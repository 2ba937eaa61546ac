"""Qwen 3 MoE: Qwen 3 attention, and a router picking top-k of E SiLU experts per token, on the CPU."""
from __future__ import annotations

import numpy as np

from cpu_kernels import activations
from engine.model.layers import Linear
from engine.model.llama import LlamaModel
from engine.model.registry import register


class MoE:
    """softmax router -> top-k experts per token (renormalized when norm_topk_prob) -> weighted sum."""

    def __init__(self, ws, layer: int, top_k: int, norm_topk_prob: bool, batch_invariant: bool = False):
        p = f"blk.{layer}."
        self.router = Linear(ws, p + "ffn_gate_inp.weight", None, batch_invariant)
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.experts = []
        gate, up, down = (p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight", p + "ffn_down_exps.weight")
        raws = [ws.raw(n) for n in (gate, up, down)]
        infos = [ws.info(n) for n in (gate, up, down)]
        for e in range(infos[0].shape[0]):
            # Each expert's rows are a zero-copy slice of the stacked 3-D tensor.
            self.experts.append(tuple(Linear.from_raw(i.ggml_type, r[e], i.shape[1:], batch_invariant)
                                      for i, r in zip(infos, raws)))
        for n, lin in zip((gate, up, down), self.experts[-1]):
            if lin.weight.fmt.repack_copies:
                ws.release(n)  # repacked: the mapped pages may leave RSS

    def __call__(self, x: np.ndarray) -> np.ndarray:
        logits = self.router(x)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        # Stable descending sort so ties pick the lower expert id, as torch.topk does on CPU.
        top = np.argsort(-probs, axis=1, kind="stable")[:, : self.top_k]
        weights = np.take_along_axis(probs, top, axis=1)
        if self.norm_topk_prob:
            weights /= weights.sum(axis=1, keepdims=True)
        out = np.zeros_like(x)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            gate, up, down = self.experts[e]
            xe = np.ascontiguousarray(x[rows])
            y = down(activations.silu_mul(gate(xe), up(xe)))
            out[rows] += weights[rows, slot][:, None].astype(np.float32) * y
        return out


@register("qwen3moe")
class Qwen3MoeModel(LlamaModel):
    qk_norm = True

    def build_mlp(self, ws, layer: int):
        if f"blk.{layer}.ffn_gate_inp.weight" not in ws.names():
            return super().build_mlp(ws, layer)  # dense layers between sparse ones (mlp_only_layers)
        return MoE(ws, layer, self.config.num_experts_per_tok, self.config.norm_topk_prob, self.batch_invariant)
