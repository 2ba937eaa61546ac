"""What a model keeps per token and per sequence, from its BlockSpecs: paged K/V in its attention layers, a fixed-size
state per sequence in its linear-attention layers (qwen3.5's Gated DeltaNet). The runner allocates from it, the
loader sizes the pools with it, the planner and `ramlm info` count it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.model.config import ModelConfig
from engine.model.registry import architecture

STATE_ITEMSIZE = 4  # states are float32 (the delta rule's S accumulates over the whole sequence)


@dataclass(frozen=True)
class CacheLayout:
    kv_layers: tuple[int, ...]                               # layers with paged K/V
    state_shapes: dict[int, tuple[tuple[int, ...], ...]]     # layer -> its per-sequence float32 state arrays

    @property
    def hybrid(self) -> bool:
        """Some layers keep a per-sequence state (prefix caching then restores states at block boundaries)."""
        return bool(self.state_shapes)

    def state_bytes_per_layer(self, layer: int) -> int:
        return sum(math.prod(s) for s in self.state_shapes.get(layer, ())) * STATE_ITEMSIZE

    @property
    def state_bytes(self) -> int:
        """One sequence's states in every layer."""
        return sum(self.state_bytes_per_layer(i) for i in self.state_shapes)


def cache_layout(cfg: ModelConfig) -> CacheLayout:
    arch = architecture(cfg.arch)
    specs = [arch.block(cfg, i) for i in range(cfg.num_layers)]
    return CacheLayout(tuple(i for i, s in enumerate(specs) if s.has_kv()),
                       {i: s.state_shapes() for i, s in enumerate(specs) if s.state_shapes()})
