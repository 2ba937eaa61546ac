"""One file per architecture family; importing this package registers them all (engine/model/registry.py)."""
from engine.model.archs import (bert, deepseek2, gemma3, gemma4, glm4moe, gpt_oss, llama, qwen2, qwen3,  # noqa: F401
                                 qwen3moe, qwen35)
