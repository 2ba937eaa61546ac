"""Runs a block's decode step as one compiled call (cpu_kernels/decode_block.py) when the block and the step
qualify, else tells the block to run its parts one by one (None). Bits are the same either way."""
from __future__ import annotations

import os

import numpy as np

from cpu_kernels.attention import _kernel_view
from cpu_kernels.decode_block import ACT_GELU_TANH, ACT_SILU, block_step
from cpu_kernels.quant.linear import GEMV_MAX_M
from cpu_kernels.quant.packed import PACKED, packed
from cpu_kernels.quant.threads import _raw_setters, serial_work
from engine.model import fused_compile, layers
from engine.model.layers import Attention, GatedMLP, rope_table

_NONE = np.empty(0, np.float32)
_ACTS = {layers.activations.silu_mul: ACT_SILU, layers.activations.gelu_tanh_mul: ACT_GELU_TANH}


def enabled() -> bool:
    """RAMLM_FUSED_BLOCKS=0 turns the fused step off (to compare, or to profile the kernels one by one)."""
    return os.environ.get("RAMLM_FUSED_BLOCKS", "1") != "0"


class FusedBlock:
    """The compiled step's fixed arguments for one block, built at the block's first call (after the offload
    layer may have replaced parts); `run` checks the parts are still those it was built from."""

    def __init__(self, block, post_attn_norm, post_ffn_norm):
        self.block = block
        self.post_attn_norm, self.post_ffn_norm = post_attn_norm, post_ffn_norm
        self.args = None  # built lazily; False when the block does not qualify
        self._kv_id, self._kv = None, None
        self._sig, self._compiled = None, False

    def run(self, x: np.ndarray, meta, kv) -> np.ndarray | None:
        if self.args is None:
            self.args = self._build() if enabled() else False
            self._sig, self._compiled = None, False
        if not self.args or not self._step_qualifies(x):
            return None
        if not self._parts_unchanged():
            self.args = False
            return None
        if self._kv_id is not kv:
            self._kv_id, self._kv = kv, (_kernel_view(kv[0]), _kernel_view(kv[1]))
        attn = self.block.attn
        cos, sin = rope_table(meta, attn.inv_freq, attn.mscale)
        get, put = _raw_setters()  # also launches the pool, whose symbols block_step links to
        args = (x, *self.args, cos, sin, *self._kv, meta.slot_mapping, meta.query_start_loc, meta.seq_lens,
                meta.block_tables, meta.max_seq_len, serial_work())
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
    def _step_qualifies(x: np.ndarray) -> bool:
        """Every Linear of the step would run its GEMV (Linear._matmul): no long prefill chunk among the rows."""
        rows = layers.ROWS
        if rows.applies_to(x):
            return not rows.large
        return x.shape[0] <= GEMV_MAX_M

    def _parts_unchanged(self) -> bool:
        b = self.block
        return (b.attn is self._attn and b.mlp is self._mlp and not b.attn.qkv._replaced()
                and not b.mlp.gate_up._replaced() and b.attn.o is self._o and b.mlp.down is self._down)

    def _build(self):
        """block_step's fixed arguments for this block, or False when a part is not what it runs."""
        block = self.block
        attn, mlp = block.attn, block.mlp
        if type(attn) is not Attention or type(mlp) is not GatedMLP or mlp.act not in _ACTS:
            return False
        self._attn, self._mlp, self._o, self._down = attn, mlp, attn.o, mlp.down
        qkv = _qkv_layout(attn)
        gate_up = mlp.gate_up
        if qkv is None or len(gate_up.groups) != 1 or len(gate_up.groups[0][1]) != 2:
            return False
        gu = gate_up.groups[0][0]
        (_, lo0, hi0), (_, lo1, hi1) = gate_up.groups[0][1]
        if (lo0, hi0, hi1) != (0, lo1, 2 * lo1):  # gate then up, equal halves (GatedMLP's stacked path)
            return False
        lins = [*qkv[0], attn.o, gu, mlp.down]
        if any(lin.bias is not None or lin.weight.ggml_type not in PACKED for lin in lins):
            return False
        norms = [block.attn_norm, self.post_attn_norm, block.ffn_norm, self.post_ffn_norm]
        nw = tuple(np.ascontiguousarray(n.weight, dtype=np.float32) if n is not None else _NONE for n in norms)
        eps = tuple(float(n.eps) if n is not None else 0.0 for n in norms)
        qn, kn = attn.q_norm, attn.k_norm
        qk_w = tuple(np.ascontiguousarray(n.weight, dtype=np.float32) if n is not None else _NONE for n in (qn, kn))
        attn_f = (float(qn.eps) if qn is not None else 0.0, float(kn.eps) if kn is not None else 0.0,
                  float(attn.scale), float(attn.softcap or 0.0))
        gemvs = tuple(packed(lin.weight) for lin in lins)
        dims = tuple(int(lin.weight.N) for lin in lins)
        nbytes = tuple(int(lin.weight.nbytes) for lin in lins)
        layout = (*qkv[1], int(attn.num_heads), _ACTS[mlp.act], int(bool(attn.neox)), lo0, lo1)
        return nw, eps, gemvs, dims, nbytes, layout, qk_w, attn_f, int(attn.sliding_window or 0)


def _qkv_layout(attn):
    """((q's, k's, v's group Linear), (k_src, v_src, q0, k0, v0)) for block_step, or None."""
    where = {}  # part index -> (group index, first column)
    for g, (_lin, spans) in enumerate(attn.qkv.groups):
        for i, lo, _hi in spans:
            where[i] = (g, lo)
    if sorted(where) != [0, 1, 2]:
        return None
    (gq, q0), (gk, k0), (gv, v0) = where[0], where[1], where[2]
    group = [lin for lin, _ in attn.qkv.groups]
    k_src = 1 if gk == gq else 0
    v_src = 1 if gv == gq else (2 if gv == gk else 0)
    return (group[gq], group[gk], group[gv]), (k_src, v_src, q0, k0, v0)
