"""Multi-LoRA serving: adapters chosen per request (LoRARequest), read from PEFT folders or llama.cpp's GGUF LoRA files,
kept in RAM (LRU), and applied per row over the shared, still quantized base weights (cpu_kernels/lora.py)."""
from engine.lora.request import LoRARequest

__all__ = ["LoRARequest"]
