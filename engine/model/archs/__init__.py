"""One file per architecture family; importing this package registers them all (engine/model/registry.py)."""
from engine.model.archs import deepseek2, gemma3, glm4moe, gpt_oss, llama, qwen2, qwen3, qwen3moe, qwen35  # noqa: F401
