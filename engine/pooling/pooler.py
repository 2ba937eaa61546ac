"""One pooling request's running pool over its prompt's final-normed hidden rows (chunk by chunk, as prefill runs),
and the vector it ends with."""
from __future__ import annotations

from typing import Optional

import numpy as np

from engine.pooling.config import PoolerConfig
from engine.pooling.params import PoolingParams


class PoolingState:
    """head: for the classify task, the classification head (a Linear: pooled row -> class logits)."""

    def __init__(self, config: PoolerConfig, params: PoolingParams, head=None):
        self.type = config.pooling_type
        self.normalize = config.normalize if params.normalize is None else params.normalize
        self.dimensions = params.dimensions
        self.dense = config.dense
        self.head = head if params.task == "classify" else None
        self._sum: Optional[np.ndarray] = None  # MEAN: float64 sum of the rows so far
        self._count = 0
        self._pick: Optional[np.ndarray] = None  # LAST: the latest row; CLS: the first

    def add(self, start: int, rows: np.ndarray) -> None:
        """rows f32 (n, H): positions start .. start + n - 1, final-normed. A request preempted and recomputed
        starts again at 0: so does its pool."""
        if start == 0:
            self._sum, self._count, self._pick = None, 0, None
        if self.type == "MEAN":
            s = rows.sum(axis=0, dtype=np.float64)
            self._sum = s if self._sum is None else self._sum + s
            self._count += rows.shape[0]
        elif self.type == "LAST":
            self._pick = rows[-1].copy()
        elif start == 0:
            self._pick = rows[0].copy()

    def result(self) -> np.ndarray:
        """The embedding, float32: pooled, cut to the requested dimensions, then normalized if asked; for the classify
        task the class probabilities."""
        v = (self._sum / self._count) if self.type == "MEAN" else self._pick.astype(np.float64)
        if self.head is not None:  # class probabilities (vLLM's default activations): softmax, sigmoid for one label
            logits = self.head(np.ascontiguousarray(v[None], dtype=np.float32), per_row=True)[0].astype(np.float64)
            if logits.shape[0] == 1:  # a score (reranker, reward model): softmax over one class would always be 1
                return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
            e = np.exp(logits - logits.max())
            return (e / e.sum()).astype(np.float32)
        for w, b, act in self.dense:  # sentence-transformers Dense projections, in float64 like the pool
            v = w @ v + (0.0 if b is None else b)
            if act == "tanh":
                v = np.tanh(v)
        if self.dimensions is not None:
            v = v[:self.dimensions]
        if self.normalize:
            v = v / max(float(np.linalg.norm(v)), 1e-12)  # torch.nn.functional.normalize's eps
        return v.astype(np.float32)
