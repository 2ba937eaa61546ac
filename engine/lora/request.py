"""LoRARequest: which adapter a request runs with (vLLM's class and field names)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(eq=False)
class LoRARequest:
    """lora_name: the adapter's name (the server's `model` field); lora_int_id: a positive id, unique per adapter;
    lora_path: a PEFT folder (adapter_config.json + adapter_model.safetensors) or a GGUF LoRA file."""
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive integer, got {self.lora_int_id!r}")
        if not self.lora_name:
            raise ValueError("lora_name must not be empty")
        if not self.lora_path:
            raise ValueError(f"LoRA adapter {self.lora_name!r}: lora_path is empty")

    # vLLM's accessors
    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    def __eq__(self, other) -> bool:  # vLLM: requests with the same name are the same adapter
        return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)
