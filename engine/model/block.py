"""One layer, built from its BlockSpec: residual steps x = x + post(part(pre(x))), run kernel by kernel, or as one
compiled call in decode steps (fused_block.py), or replaced by its torch twin on a GPU (offload/convert.py)."""
from __future__ import annotations

import numpy as np

from engine.model.fused_block import FusedBlock
from engine.model.parts import build_part
from engine.model.parts.linear import has, vector
from engine.model.parts.norm import RMSNorm, add_and_norm
from engine.model.spec import BlockSpec


class Block:
    def __init__(self, spec: BlockSpec, ws, cfg, layer: int, batch_invariant: bool, shared: dict):
        p = f"blk.{layer}."
        self.spec, self.layer = spec, layer
        self.parts = [build_part(st.part, ws, cfg, p, batch_invariant, shared) for st in spec.steps]
        self.pre = [RMSNorm(ws, p + st.pre + ".weight", cfg.rms_norm_eps) if st.pre else None for st in spec.steps]
        self.post = [RMSNorm(ws, p + st.post + ".weight", cfg.rms_norm_eps) if st.post else None for st in spec.steps]
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
            x, h = add_and_norm(x, part(h, meta, kv), self.post[i], nxt)
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
