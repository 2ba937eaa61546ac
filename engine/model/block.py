"""One layer, built from its BlockSpec: residual steps x = after(x + post(part(pre(x)))), run kernel by kernel, or as
one compiled call in decode steps (fused_block.py), or replaced by its torch twin on a GPU (offload/convert.py)."""
from __future__ import annotations

import numpy as np

from engine.model.fused_block import FusedBlock
from engine.model.parts import build_part
from engine.model.parts.linear import has, vector
from engine.model.parts.norm import add_and_norm, make_norm
from engine.model.spec import BlockSpec


class Block:
    def __init__(self, spec: BlockSpec, ws, cfg, layer: int, batch_invariant: bool, shared: dict):
        p = f"blk.{layer}."
        self.spec, self.layer = spec, layer
        self.parts = [build_part(st.part, ws, cfg, p, batch_invariant, shared) for st in spec.steps]
        norm = lambda name: make_norm(spec.norm, ws, p + name if name else None, cfg.rms_norm_eps)  # noqa: E731
        self.pre = [norm(st.pre) for st in spec.steps]
        self.post = [norm(st.post) for st in spec.steps]
        self.after = [norm(st.after) for st in spec.steps]  # post-norm (BERT): the residual sum is normed
        self.rms = spec.norm == "rms" and not any(self.after)  # add_and_norm's one kernel serves every step
        scale = p + spec.out_scale if spec.out_scale else None
        self.out_scale = vector(ws, scale).copy() if scale and has(ws, scale) else None  # f32 (1,) on the output
        self.fused = FusedBlock(self)

    def __call__(self, x: np.ndarray, meta, kv) -> np.ndarray:
        y = self.fused.run(x, meta, kv)  # a decode step: the whole block in one compiled call
        if y is not None:
            return y
        h = self.pre[0](x) if self.pre[0] is not None else x
        for i, part in enumerate(self.parts):
            nxt = self.pre[i + 1] if i + 1 < len(self.parts) else None
            y = part(h, meta, kv)
            if self.rms:
                x, h = add_and_norm(x, y, self.post[i], nxt)
            else:
                y = self.post[i](y) if self.post[i] is not None else y
                x = self.after[i].add(x, y) if self.after[i] is not None else x + y
                h = nxt(x) if nxt is not None else h
            if nxt is None:
                h = x
        if self.out_scale is not None:
            x *= self.out_scale[0]  # x is add_and_norm's own array
        return x

    def attention(self):
        """The part whose RoPE table the step uses (the fused call takes one), or None."""
        return next((p for p in self.parts if hasattr(p, "rope_table")), None)

    def step_input(self, meta):
        """Rows a part reads from the step besides x (its per-layer embeddings: the fused call takes them), or None."""
        part = next((p for p in self.parts if hasattr(p, "step_input")), None)
        return part.step_input(meta) if part is not None else None
