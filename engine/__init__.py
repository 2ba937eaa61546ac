"""ramlm's engine: `from engine import LLM, SamplingParams`. Heavy modules load on first use."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "PoolingParams", "LLMEngine", "EngineArgs", "RequestOutput", "CompletionOutput",
           "EmbeddingRequestOutput", "PoolingRequestOutput", "LoRARequest"]


def __getattr__(name: str):
    if name == "LLM":
        from engine.entrypoints.llm import LLM
        return LLM
    if name == "SamplingParams":
        from engine.sample.sampling import SamplingParams
        return SamplingParams
    if name == "PoolingParams":
        from engine.pooling.params import PoolingParams
        return PoolingParams
    if name == "LoRARequest":
        from engine.lora.request import LoRARequest
        return LoRARequest
    if name == "LLMEngine":
        from engine.engine import LLMEngine
        return LLMEngine
    if name == "EngineArgs":
        from engine.args import EngineArgs
        return EngineArgs
    if name in ("RequestOutput", "CompletionOutput", "EmbeddingRequestOutput", "PoolingRequestOutput"):
        from engine import outputs
        return getattr(outputs, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
