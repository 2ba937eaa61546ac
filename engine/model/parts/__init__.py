"""The parts a block is made of, one file per kind, each built from its spec (engine/model/spec.py)."""
from __future__ import annotations

from engine.model.parts.attention import Attention
from engine.model.parts.delta_net import GatedDeltaNet
from engine.model.parts.mla import MLA
from engine.model.parts.mlp import MLP, GatedMLP
from engine.model.parts.moe import MoE
from engine.model.parts.parallel_ffn import ParallelFFN
from engine.model.parts.per_layer import PerLayerInput
from engine.model.spec import (AttentionSpec, GatedDeltaNetSpec, GatedMLPSpec, MLASpec, MLPSpec, MoESpec,
                               ParallelFFNSpec, PerLayerInputSpec)

PART_CLASSES = {AttentionSpec: Attention, GatedMLPSpec: GatedMLP, MoESpec: MoE, MLASpec: MLA,
                GatedDeltaNetSpec: GatedDeltaNet, ParallelFFNSpec: ParallelFFN, PerLayerInputSpec: PerLayerInput,
                MLPSpec: MLP}


def build_part(spec, ws, cfg, prefix: str, batch_invariant: bool, shared: dict):
    """The CPU module of a part spec, its weights read from ws under `prefix` (blk.{i}.)."""
    try:
        cls = PART_CLASSES[type(spec)]
    except KeyError:
        raise NotImplementedError(f"no module for part {type(spec).__name__}") from None
    return cls(spec, ws, cfg, prefix, batch_invariant, shared)
