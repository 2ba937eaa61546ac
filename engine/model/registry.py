"""Architectures registered by their GGUF `general.architecture` name and their HF model_type values."""
from __future__ import annotations

from engine.errors import ModelLoadError
from engine.model.architecture import Architecture

ARCHITECTURES: dict[str, Architecture] = {}
_BY_MODEL_TYPE: dict[str, Architecture] = {}


def register(cls: type[Architecture]) -> type[Architecture]:
    arch = cls()
    ARCHITECTURES[arch.name] = arch
    for mt in arch.hf_model_types:
        _BY_MODEL_TYPE[mt] = arch
    return cls


def architecture(name: str, source: str = "") -> Architecture:
    """The architecture of GGUF name `name`; ModelLoadError naming the supported ones."""
    _import_all()
    if name not in ARCHITECTURES:
        where = f"{source}: " if source else ""
        raise ModelLoadError(f"{where}architecture '{name or '(general.architecture missing)'}' is not supported "
                             f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    return ARCHITECTURES[name]


def architecture_of_model_type(model_type: str, source: str) -> Architecture:
    _import_all()
    if model_type not in _BY_MODEL_TYPE:
        raise ModelLoadError(f"{source}: model_type '{model_type}' is not supported "
                             f"(supported: {', '.join(sorted(_BY_MODEL_TYPE))})")
    return _BY_MODEL_TYPE[model_type]


def hf_model_types() -> tuple[str, ...]:
    _import_all()
    return tuple(_BY_MODEL_TYPE)


def _import_all() -> None:
    # Importing the package runs every architecture file's @register.
    import engine.model.archs  # noqa: F401
