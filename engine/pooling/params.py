"""PoolingParams: what one pooling request asks for (vLLM's class and field names)."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

TASKS = ("embed", "classify")


@dataclass
class PoolingParams:
    """dimensions: keep the first d values of the embedding (Matryoshka models only), then normalize again.
    normalize: L2-normalize the pooled vector (None: the model's pooler config decides).
    task: "embed", or "classify" (the class probabilities of a model with a classification head; dimensions and
    normalize do not apply). vLLM's token_embed and token_classify are not served yet."""
    dimensions: Optional[int] = None
    normalize: Optional[bool] = None
    task: str = "embed"

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"pooling task {self.task!r} is not supported (supported: {', '.join(TASKS)})")
        if self.dimensions is not None and (not isinstance(self.dimensions, int) or isinstance(self.dimensions, bool)
                                            or self.dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}")

    def clone(self) -> "PoolingParams":
        return copy.deepcopy(self)
