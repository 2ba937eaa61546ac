"""Model loading: a path -> weights -> the registered architecture's decoder, built (and repacked) on the CPU."""
from __future__ import annotations

from engine.model.config import ModelConfig
from engine.model.decoder import DecoderModel
from engine.model.registry import architecture
from engine.model.weights import open_weights


def load_model(path: str, batch_invariant: bool = False, weights=None):
    """Returns (model, config). Raises ModelLoadError for anything wrong with the files.
    weights: an already opened WeightSource for `path` (else it is opened here)."""
    ws = weights if weights is not None else open_weights(path)
    cfg: ModelConfig = ws.config
    model = DecoderModel(architecture(cfg.arch, ws.path), cfg, ws, batch_invariant=batch_invariant)
    model.weights = ws  # keeps the memory map alive while repacked views point into it
    return model, cfg
