"""Learned absolute position embeddings (spec.AbsoluteEmbeddingSpec, BERT's): each token's embedding plus its
position's and its token type's rows, then LayerNorm, before the layers."""
from __future__ import annotations

import numpy as np

from engine.model.parts.linear import Linear
from engine.model.parts.norm import LayerNorm


class AbsoluteEmbeddings:
    def __init__(self, spec, ws, cfg):
        self.num_positions = spec.num_positions
        self.positions = Linear(ws, "position_embd.weight")
        self.types = Linear(ws, "token_types.weight") if spec.num_types else None
        self.norm = LayerNorm(ws, "token_embd_norm.weight", cfg.rms_norm_eps)

    def __call__(self, x: np.ndarray, positions: np.ndarray, token_types: np.ndarray | None = None) -> np.ndarray:
        """x f32 (T, H) token embeddings (written to), positions (T,) int -> f32 (T, H). token_types (T,) int or None
        (every token type 0)."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and pos.max() >= self.num_positions:  # max_model_len keeps requests within them
            raise ValueError(f"position {int(pos.max())} is beyond the model's {self.num_positions} learned positions")
        x += self.positions.weight.embed(pos)
        if self.types is not None:
            if token_types is None:
                x += self.types.weight.embed(np.zeros(1, np.int64))  # (1, H) broadcast over the rows
            else:
                x += self.types.weight.embed(np.asarray(token_types, dtype=np.int64))
        return self.norm(x)
