"""LoRAManager: the adapters the engine knows, those loaded in RAM (least recently used dropped beyond
max_cpu_loras, but never one in a slot; read again from their path when needed), and the max_loras slots a step's rows pick from (vLLM's
LoRA model manager, on the CPU: a slot's weights are copies in the stacked arrays the kernels read)."""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Optional

from engine.lora.adapter import EMBED, HEAD, LoRAAdapter, LoRAError, read_adapter
from engine.lora.request import LoRARequest
from engine.lora.slots import SlotWeights
from engine.model.parts.linear import Linear


def adaptable(model) -> dict[str, Linear]:
    """GGUF name -> Linear of every layer weight a LoRA may adapt (the parts' own Linears)."""
    out = {}
    for block in model.blocks:
        for part in block.parts:
            for value in vars(part).values():
                if isinstance(value, Linear) and value.name:
                    out[value.name] = value
    return out


class LoRAManager:
    def __init__(self, model, arch, config, max_loras: int, max_lora_rank: int, max_cpu_loras: Optional[int],
                 dtype: str = "float32"):
        self.model, self.arch, self.config = model, arch, config
        self.dtype = dtype  # the slots' storage: float32 or bfloat16
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self.max_cpu_loras = max_cpu_loras or max_loras
        self.targets = adaptable(model)
        self.shapes = {n: (lin.weight.K, lin.weight.N) for n, lin in self.targets.items()}
        self.shapes[EMBED] = (config.vocab_size, config.hidden_size)
        self.shapes[HEAD] = (config.hidden_size, config.vocab_size)
        self.loaded: OrderedDict[int, LoRAAdapter] = OrderedDict()  # in RAM, least recently used first
        self.slots: list[int] = [0] * max_loras  # the adapter id in each slot (0: empty)
        self.slot_used = [0.0] * max_loras
        self.weights: dict[str, SlotWeights] = {}

    @classmethod
    def build(cls, args, model, config) -> Optional["LoRAManager"]:
        """None without enable_lora; ValueError where LoRA cannot run (layers placed on a GPU)."""
        if not args.enable_lora:
            return None
        placement = getattr(model, "placement", None)
        if placement is not None and placement.uses_gpu():
            raise ValueError("LoRA with layers on a GPU is not supported yet (the adapters run in the CPU kernels)")
        import numpy as np

        from cpu_kernels import lora
        from engine.model.registry import architecture
        dtype = args.lora_dtype
        if dtype == "auto":  # vLLM's auto: the model's activation type
            dtype = "float32" if args.dtype in ("float32", "float") else "bfloat16"
        lora.warmup(np.uint16 if dtype == "bfloat16" else np.float32)
        return cls(model, architecture(config.arch), config, args.max_loras, args.max_lora_rank, args.max_cpu_loras,
                   dtype)

    # ---- adapters in RAM ----
    def load(self, req: LoRARequest) -> LoRAAdapter:
        """The adapter of `req`, read and checked if it is not in RAM. Raises LoRAError (nothing changes)."""
        have = self.loaded.get(req.lora_int_id)
        if have is not None and (have.name, have.path) != (req.lora_name, req.lora_path):
            raise LoRAError(f"lora_int_id {req.lora_int_id} is adapter {have.name!r} ({have.path}), not "
                            f"{req.lora_name!r} ({req.lora_path})")
        if have is None:
            have = read_adapter(req.lora_name, req.lora_int_id, req.lora_path, self.arch, self.config)
            have.check(self.shapes, self.max_lora_rank)
            self._empty_slots(req.lora_int_id)  # a slot may still hold what this id was before it left RAM
            self.loaded[req.lora_int_id] = have
        self.loaded.move_to_end(req.lora_int_id)
        # beyond max_cpu_loras the least recently used go, but not those in a slot: their requests may be running
        spare = [lid for lid in self.loaded if lid not in self.slots and lid != req.lora_int_id]
        for lid in spare[:max(0, len(self.loaded) - self.max_cpu_loras)]:
            del self.loaded[lid]
        return have

    def remove(self, int_id: int) -> bool:
        """Drops an adapter from RAM and from its slot; True if it was there."""
        found = self.loaded.pop(int_id, None) is not None
        return self._empty_slots(int_id) or found

    def _empty_slots(self, int_id: int) -> bool:
        emptied = False
        for slot, sid in enumerate(self.slots):
            if sid == int_id:
                for w in self.weights.values():
                    w.set(slot, None)
                self.slots[slot] = 0
                emptied = True
        return emptied

    # ---- a step's slots ----
    def activate(self, requests: dict[int, LoRARequest]) -> dict[int, int]:
        """Puts the step's adapters (id -> request, at most max_loras) in slots; returns id -> slot. Adapters
        already in a slot stay there; others take the empty or least recently used slots. Raises LoRAError for an
        adapter that can no longer be read (its slot is left empty)."""
        if len(requests) > self.max_loras:
            raise RuntimeError(f"{len(requests)} adapters in one step, max_loras is {self.max_loras}")
        now = time.monotonic()
        where = {sid: slot for slot, sid in enumerate(self.slots) if sid in requests}
        free = sorted((slot for slot, sid in enumerate(self.slots) if sid not in requests),
                      key=lambda s: (self.slots[s] != 0, self.slot_used[s]))
        for lid in requests:
            if lid not in where:
                slot = free.pop(0)
                self.slots[slot] = 0
                self._install(slot, self.load(requests[lid]))
                self.slots[slot] = lid
                where[lid] = slot
        for slot in where.values():
            self.slot_used[slot] = now
        return where

    def _install(self, slot: int, adapter: LoRAAdapter) -> None:
        for name, (a, bt) in adapter.modules.items():
            if name not in self.weights:
                self.weights[name] = self._allocate(name)
        for name, w in self.weights.items():
            w.set(slot, adapter.modules.get(name))

    def _allocate(self, name: str) -> SlotWeights:
        """The slots of one weight, wired where the model reads them."""
        k, n = self.shapes[name]
        w = SlotWeights(self.max_loras, self.max_lora_rank, k, n, embedding=name == EMBED, dtype=self.dtype)
        if name == EMBED:
            self.model.lora_embed = w
        elif name == HEAD:
            self.model.lora_head = w
        else:
            self.targets[name].lora = w
        return w


__all__ = ["LoRAManager", "LoRAError", "adaptable"]
