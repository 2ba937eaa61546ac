"""The engine's LoRA part (LLMEngine mixes it in): a step's adapters put in slots, and each row's slot for the
forward pass and the logits."""
from __future__ import annotations

from typing import Optional

import numpy as np


class LoRASteps:
    """Reads LLMEngine's lora (LoRAManager), parents, children, _child_parent, runner; sets _lora_slot_of."""

    def _activate_loras(self, so, failures: dict[str, BaseException]) -> None:
        """Puts the step's adapters in slots (self._lora_slot_of); an adapter that can no longer be read (its file
        gone since it left RAM) fails its requests alone."""
        wanted: dict[int, object] = {}
        for s in so.scheduled:
            pid = self._child_parent.get(s.req_id)
            lora = self.parents[pid].lora_request if pid in self.parents else None
            if lora is not None:
                wanted[lora.lora_int_id] = lora
        for lid, lora in list(wanted.items()):
            try:
                self.lora.load(lora)
            except Exception as e:
                del wanted[lid]
                for s in so.scheduled:
                    if s.req_id in self.children and self.children[s.req_id].request.lora_id == lid:
                        self._fail(s.req_id, e, failures)
        try:
            self._lora_slot_of = self.lora.activate(wanted)
        except Exception as e:  # (out of memory for the slots): the adapted requests fail, the others run
            self._lora_slot_of = {}
            for s in so.scheduled:
                if s.req_id in self.children and self.children[s.req_id].request.lora_id:
                    self._fail(s.req_id, e, failures)

    def _lora_slot(self, child_id: str) -> int:
        """The slot of a scheduled completion's adapter this step (-1: none)."""
        child = self.children.get(child_id)
        return self._lora_slot_of.get(child.request.lora_id, -1) if child is not None else -1

    def _lora_rows(self, child_ids: list[str]) -> Optional[np.ndarray]:
        """(R,) int32 adapter slots of logits rows, one per completion id; None when no row has one."""
        slots = [self._lora_slot(rid) for rid in child_ids]
        return np.asarray(slots, np.int32) if any(s >= 0 for s in slots) else None

    def _spec_logits(self, slot: int, rows: np.ndarray, per_row: bool = False) -> np.ndarray:
        """compute_logits for one completion's verification rows (its adapter's slot: -1 none)."""
        slots = np.full(rows.shape[0], slot, np.int32) if slot >= 0 else None
        return self.runner.compute_logits(rows, per_row=per_row, lora_slots=slots)
