"""Architectures registered by their GGUF `general.architecture` name."""
from __future__ import annotations

from typing import Callable

ARCHITECTURES: dict[str, type] = {}


def register(*names: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        for n in names:
            ARCHITECTURES[n] = cls
        return cls
    return deco


def model_class(arch: str) -> type:
    _import_all()
    if arch not in ARCHITECTURES:
        from engine.errors import ModelLoadError
        raise ModelLoadError(f"unsupported architecture {arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[arch]


def _import_all() -> None:
    # Importing the modules runs their @register decorators.
    from engine.model import llama, qwen2, qwen3, gemma3, qwen3moe  # noqa: F401
