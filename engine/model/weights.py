"""WeightSource: one interface over a GGUF file or an HF folder; architectures read tensors by GGUF names."""
from __future__ import annotations

import os
from typing import Any, Iterable

import numpy as np

from engine.errors import ModelLoadError
from engine.model.config import ModelConfig
from engine.model.gguf import GGUFFile, TensorInfo, open_gguf
from engine.model.gguf_config import config_from_gguf


class WeightSource:
    """What an architecture reads.

    Attributes:
        config: ModelConfig. path: the .gguf file or the HF folder. format: "gguf" or "hf".
        metadata: GGUF metadata (tokenizer keys included) or, for HF, the config.json dict.
    Tensor names follow GGUF (`blk.{i}.attn_q.weight`) and GGUF conventions (see docs/internals.md):
    llama attn_q/attn_k rows permuted as llama.cpp's converter does, gemma norm weights include the +1.
    """
    config: ModelConfig
    path: str
    format: str
    metadata: dict[str, Any]

    def names(self) -> list[str]:
        raise NotImplementedError

    def info(self, name: str) -> TensorInfo:
        """ggml_type, shape (numpy order), nbytes of tensor `name`; ModelLoadError if absent."""
        raise NotImplementedError

    def raw(self, name: str) -> np.ndarray:
        """As GGUFFile.raw: uint8 (*shape[:-1], bytes_per_row) for quantized types, typed
        (float32 / float16 / uint16 bits for bf16) with `shape` otherwise. Read-only."""
        raise NotImplementedError

    def in_perm(self, name: str) -> np.ndarray | None:
        """The order (int64 (K,)) in which tensor `name`'s inputs are stored, when it is not 0..K-1 (act-order
        GPTQ): its matmul reads x[..., perm]. Ask before raw(name): a source may refuse to hand such a tensor to a
        reader that never asked."""
        return None

    def __contains__(self, name: str) -> bool:
        return name in set(self.names())

    def release(self, name: str, lo: int = 0, hi: int | None = None) -> None:
        """The caller copied tensor `name` (repacked it), or its bytes [lo, hi): their mapped pages may leave
        RSS. Optional."""

    def required(self, names: Iterable[str]) -> None:
        """Raise ModelLoadError naming the tensors of `names` that are missing."""
        have = set(self.names())
        missing = [n for n in names if n not in have]
        if missing:
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise ModelLoadError(f"{self.path}: missing required tensor(s) "
                                 f"{', '.join(repr(n) for n in missing[:5])}{more}")


class GGUFWeights(WeightSource):
    """A GGUF file: tensors are zero-copy views of its memory map."""
    format = "gguf"

    def __init__(self, gf: GGUFFile, config: ModelConfig):
        self.gguf, self.config, self.path, self.metadata = gf, config, gf.path, gf.metadata

    def names(self) -> list[str]:
        return list(self.gguf.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.gguf.tensors

    def info(self, name: str) -> TensorInfo:
        return self.gguf.info(name)

    def raw(self, name: str) -> np.ndarray:
        return self.gguf.raw(name)

    def release(self, name: str, lo: int = 0, hi: int | None = None) -> None:
        self.gguf.release(name, lo, hi)


def open_weights(path: str | os.PathLike) -> WeightSource:
    """Open a model: a .gguf file or an HF folder (config.json + *.safetensors).

    Raises:
        ModelLoadError: the path is missing, is neither, or cannot be used.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file or folder")
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelLoadError(f"{path}: a folder without config.json is not an HF model folder "
                                 "(expected config.json + *.safetensors, or give a .gguf file)")
        from engine.model.hf import open_hf  # noqa: PLC0415 (hf.py imports this module)
        return open_hf(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read: {e}") from e
    if magic != b"GGUF":
        raise ModelLoadError(f"{path}: neither a GGUF file (magic {magic!r}) nor an HF folder")
    gf = open_gguf(path)
    return GGUFWeights(gf, config_from_gguf(gf))
