"""Runs a block's decode step as one compiled call (cpu_kernels/decode_block.py) when the block and the step
qualify, else tells the block to run its parts one by one (None). Bits are the same either way.

The call's arguments come from the block's own parts (Part.fused()), built at the block's first decode step, after
the offload layer may have replaced some of them; a part replaced later makes them stale, and the block then runs
kernel by kernel."""
from __future__ import annotations

import numpy as np

from cpu_kernels import envs
from cpu_kernels.attention import _kernel_view
from cpu_kernels.decode_block import block_step
from cpu_kernels.quant.linear import GEMV_MAX_M
from cpu_kernels.quant.threads import _raw_setters, serial_work
from engine.model import fused_compile
from engine.model.parts.norm import norm_args

_NO_ROPE = np.zeros((0, 0), np.float32)
_NO_INPUT = np.zeros((0, 0), np.float32)  # no per-layer input rows
_NO_SCALE = np.zeros(0, np.float32)       # no output scale


def enabled() -> bool:
    """RAMLM_FUSED_BLOCKS=0 turns the fused step off (to compare, or to profile the kernels one by one)."""
    return envs.get("RAMLM_FUSED_BLOCKS")


class FusedBlock:
    def __init__(self, block):
        self.block = block
        self.args = None  # (first norm, steps) built lazily; False when the block does not qualify
        self._leaves = None  # the parts and Linears the arguments were built from
        self._kv_id, self._kv = None, None
        self._sig, self._compiled = None, False

    def reset(self) -> None:
        """Rebuild the arguments at the next call (after RAMLM_FUSED_BLOCKS or the parts changed)."""
        self.args, self._sig, self._compiled = None, None, False

    def run(self, x: np.ndarray, meta, kv) -> np.ndarray | None:
        if self.args is None:
            self.args = self._build() if enabled() else False
            self._sig, self._compiled = None, False
        if not self.args or not self._step_qualifies(x, meta.rows):
            return None
        if self._current_leaves() != self._leaves:
            self.args = False
            return None
        if self._kv_id is not kv:
            self._kv_id, self._kv = kv, (_kernel_view(kv[0]), _kernel_view(kv[1]))
        attn = self.block.attention()
        cos, sin = attn.rope_table(meta) if attn is not None else (_NO_ROPE, _NO_ROPE)
        layer_in = self.block.step_input(meta)
        scale = self.block.out_scale
        get, put = _raw_setters()  # also launches the pool, whose symbols block_step links to
        args = (x, *self.args, cos, sin, *self._kv, meta.slot_mapping, meta.query_start_loc, meta.seq_lens,
                meta.block_tables, meta.max_seq_len, serial_work(), meta.positions, meta.state_slots, meta.snap_rows,
                meta.snap_slots, _NO_SCALE if scale is None else scale, _NO_INPUT if layer_in is None else layer_in)
        if not self._compiled:
            self._sig = self._sig or fused_compile.signature(args)
            self._compiled = fused_compile.ready(self._sig)
            if not self._compiled:
                return None  # compiling in the background: the parts run meanwhile
        prev = get()
        try:
            return block_step(*args)
        except Exception:
            put(prev)
            raise

    @staticmethod
    def _step_qualifies(x: np.ndarray, rows) -> bool:
        """Every Linear of the step would run its GEMV (Linear._matmul): no long prefill chunk among the rows, and no
        row with a LoRA adapter (its updates run beside the Linears)."""
        if rows is not None and rows.applies_to(x):
            return not rows.large and rows.lora_slots is None
        return x.shape[0] <= GEMV_MAX_M

    def _current_leaves(self) -> tuple:
        return tuple((p, p.leaves()) for p in self.block.parts)

    def _build(self):
        """block_step's (first norm, steps) for this block, or False when a part cannot run fused."""
        b = self.block
        if not b.rms:  # the compiled step norms with RMSNorm before and after parts only
            return False
        parts = [p.fused() for p in b.parts]
        if any(f is None for f in parts):
            return False
        self._leaves = self._current_leaves()
        steps = []
        for i, f in enumerate(parts):
            nxt = b.pre[i + 1] if i + 1 < len(parts) else None
            (pw, pe), (nw, ne) = norm_args(b.post[i]), norm_args(nxt)
            steps.append((f, np.ascontiguousarray(pw), pe, np.ascontiguousarray(nw), ne))
        w0, e0 = norm_args(b.pre[0])
        return (np.ascontiguousarray(w0), e0), tuple(steps)
