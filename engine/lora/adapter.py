"""LoRAAdapter: one adapter's updates by GGUF weight name, read from a PEFT folder or a GGUF LoRA file and checked
against the base model's weights before any request uses it."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

EMBED = "token_embd.weight"  # the token embedding: its update adds A's column of the token, times B
HEAD = "output.weight"       # the output matrix (lm_head), adapted apart from a tied embedding


class LoRAError(ValueError):
    """An adapter that cannot run on this model (the message says why); nothing was changed."""


@dataclass
class LoRAAdapter:
    """modules: GGUF weight name -> (A (r, K), B^T (r, N) with the scale folded in), float32; K is the weight's
    input size (the vocabulary for EMBED), N its output size."""
    name: str
    int_id: int
    path: str
    modules: dict[str, tuple[np.ndarray, np.ndarray]]

    @property
    def rank(self) -> int:
        return max(a.shape[0] for a, _ in self.modules.values())

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.modules.values())

    def check(self, shapes: dict[str, tuple[int, int]], max_rank: int) -> None:
        """Raises LoRAError unless every module adapts a weight of the base model, with its (K, N), within max_rank."""
        if not self.modules:
            raise LoRAError(f"LoRA adapter {self.name!r} ({self.path}): no LoRA weights found")
        for name, (a, b) in self.modules.items():
            if name not in shapes:
                raise LoRAError(f"LoRA adapter {self.name!r}: {name} is not a weight LoRA can adapt in this model "
                                f"(adaptable: the attention and MLP projections, the embedding and the output)")
            k, n = shapes[name]
            if a.shape[1] != k or b.shape[1] != n or a.shape[0] != b.shape[0]:
                raise LoRAError(f"LoRA adapter {self.name!r}: {name} has A {a.shape[::-1]} and B {b.shape[::-1]}, "
                                f"which do not fit the base weight's {k} inputs and {n} outputs (another base model?)")
            if a.shape[0] > max_rank:
                raise LoRAError(f"LoRA adapter {self.name!r}: rank {a.shape[0]} of {name} is above max_lora_rank "
                                f"({max_rank})")


def read_adapter(name: str, int_id: int, path: str, arch, config) -> LoRAAdapter:
    """Reads a PEFT folder or a GGUF LoRA file (by what `path` is). Raises LoRAError naming what is wrong."""
    from engine.lora import gguf_lora, peft
    if os.path.isdir(path):
        modules = peft.read(path, arch, config)
    elif os.path.isfile(path) and path.endswith(".gguf"):
        modules = gguf_lora.read(path, arch)
    elif os.path.exists(path):
        raise LoRAError(f"LoRA adapter {name!r}: {path} is neither a PEFT folder nor a .gguf file")
    else:
        raise LoRAError(f"LoRA adapter {name!r}: {path} does not exist")
    return LoRAAdapter(name, int_id, path, modules)


def scaled(a: np.ndarray, b: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """PEFT's A (r, K) and B (N, r) -> this module's (A, B^T * scale), contiguous float32."""
    return (np.ascontiguousarray(a, dtype=np.float32),
            np.ascontiguousarray(np.asarray(b, dtype=np.float32).T * np.float32(scale)))
