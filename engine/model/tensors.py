"""The tensors a model file of a given config holds (GGUF names, numpy shapes), derived from the architecture's
BlockSpecs: synthetic files (bench/make_synthetic.py) and the planner's synthetic shapes (offload/meta.py) use it."""
from __future__ import annotations

from engine.model.config import ModelConfig
from engine.model.registry import architecture


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    H, V = cfg.hidden_size, cfg.vocab_size
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = (V, H)
    arch = architecture(cfg.arch)
    out.update(arch.model_tensors(cfg))  # model-level tensors of the architecture (per-layer embeddings, ...)
    for i in range(cfg.num_layers):
        for name, shape in arch.block(cfg, i).tensors(cfg).items():
            out[f"blk.{i}.{name}"] = shape
    return out
