"""Per-layer embeddings (Gemma 4's PLE): every token gets a small embedding per layer, computed once before the layers
(PerLayerEmbeddings, spec.PerLayerEmbeddingSpec) and read by each layer's gated projection step (PerLayerInput,
spec.PerLayerInputSpec): x -> proj(gelu(inp_gate(x)) * e_layer)."""
from __future__ import annotations

import math

import numpy as np

from engine.model.parts import mlp
from engine.model.parts.base import Part, packed_linears
from engine.model.parts.linear import Linear
from engine.model.parts.norm import RMSNorm, small_on_one_thread

STEP_KEY = "per_layer_inputs"  # BatchMetadata.step_cache: f32 (T, layers, P), set by the decoder


class PerLayerEmbeddings:
    """(T, H) scaled token embeddings and their ids -> f32 (T, layers, P), HF's get_per_layer_inputs +
    project_per_layer_inputs: (RMSNorm(proj(x) H^-0.5) + table[ids] sqrt(P)) 2^-0.5."""

    def __init__(self, spec, ws, cfg, batch_invariant: bool):
        self.width, self.num_layers = spec.width, spec.num_layers
        self.table = Linear(ws, "per_layer_token_embd.weight", None, batch_invariant)
        self.proj = Linear(ws, "per_layer_model_proj.weight", None, batch_invariant)
        self.norm = RMSNorm(ws, "per_layer_proj_norm.weight", cfg.rms_norm_eps)
        # HF multiplies in float32 by scalars rounded to float32
        self.token_scale = np.float32(math.sqrt(spec.width))
        self.proj_scale = np.float32(cfg.hidden_size ** -0.5)
        self.mix_scale = np.float32(2.0 ** -0.5)

    def __call__(self, ids: np.ndarray, x: np.ndarray, rows) -> np.ndarray:
        T, L, P = x.shape[0], self.num_layers, self.width
        tok = self.table.weight.embed(np.ascontiguousarray(ids, dtype=np.int64))
        tok *= self.token_scale
        ctx = self.proj(x, rows)
        ctx *= self.proj_scale
        ctx = self.norm(ctx.reshape(T * L, P))
        out = ctx.reshape(T, L, P) + tok.reshape(T, L, P)
        out *= self.mix_scale
        return out


class PerLayerInput(Part):
    """A layer's step x -> proj(act(inp_gate(x)) * e): e its rows of the step's per-layer embeddings."""

    def __init__(self, spec, ws, cfg, prefix: str, batch_invariant: bool, shared: dict):
        self.names = {"gate": prefix + "inp_gate.weight", "proj": prefix + "proj.weight"}
        for k, name in self.names.items():
            setattr(self, k, Linear(ws, name, None, batch_invariant))
        self.layer, self.width, self.act = spec.layer, spec.width, spec.act

    def step_input(self, meta) -> np.ndarray:
        """This layer's per-layer embedding rows of the step, f32 (T, P) C-contiguous."""
        return np.ascontiguousarray(meta.step_cache[STEP_KEY][:, self.layer])

    def __call__(self, x: np.ndarray, meta, kv=None) -> np.ndarray:
        rows = meta.rows
        g = self.gate(x, rows)
        with small_on_one_thread(g):
            h = mlp.ACTIVATIONS[self.act][0](g, 0, self.step_input(meta), 0, self.width)
        return self.proj(h, rows)

    def fused(self):
        from cpu_kernels.decode_block import FusedPerLayerInput
        from cpu_kernels.quant.packed import packed
        lins = (self.gate, self.proj)
        if not packed_linears(lins):
            return None
        return FusedPerLayerInput(tuple(packed(lin.weight) for lin in lins), (int(self.width), int(self.proj.weight.N)),
                                  tuple(int(lin.weight.nbytes) for lin in lins), (mlp.ACTIVATIONS[self.act][1],))

    def to_device(self, conv, lp, kv_cache=None):
        from gpu_kernels.per_layer import DevicePerLayerInput
        leaves = {k: conv.leaf(getattr(self, k), name, lp) for k, name in self.names.items()}
        return DevicePerLayerInput(leaves["gate"], leaves["proj"], self.layer, self.act, STEP_KEY)
