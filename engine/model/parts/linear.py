"""Linear (y = x @ W^T + b over any weight format) and Projections (Linears reading the same x, stacked into one
matmul). Which kernel a Linear runs follows the batch's row groups (worker/batch.py's RowGroups), passed in."""
from __future__ import annotations

import threading

import numpy as np

from cpu_kernels.quant.linear import QuantLinear
from cpu_kernels.quant.threads import serial_if, serial_work
from engine.lora.slots import add_parts


def vector(ws, name: str) -> np.ndarray:
    """A 1-D weight (norm scale, bias) as contiguous float32."""
    raw = ws.raw(name)
    if raw.dtype == np.uint16:  # bf16 bits
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(-1).copy()
    return np.ascontiguousarray(raw, dtype=np.float32).reshape(-1)


def has(ws, name: str) -> bool:
    return name in ws


class Linear:
    """y = x @ W^T (+ b) over a quantized or float weight stored (N, K)."""

    def __init__(self, ws, name: str, bias: str | None = None, batch_invariant: bool = False):
        info = ws.info(name)
        self.name = name  # the GGUF weight (LoRA adapters name what they adapt by it)
        self.lora = None  # lora/slots.SlotWeights once an adapter adapts this weight
        n, k = info.shape[-2], info.shape[-1]
        self.in_perm = ws.in_perm(name)  # act-order weights store their inputs in this order
        self.weight = QuantLinear.from_raw(info.ggml_type, ws.raw(name), (n, k))
        if self.weight.fmt.repack_copies:
            ws.release(name)  # repacked into RAM: the file's pages need not stay in RSS (peak RSS ~1x the file)
        self.bias = vector(ws, bias) if bias and has(ws, bias) else None
        self.batch_invariant = batch_invariant

    @classmethod
    def of(cls, weight: QuantLinear, bias: np.ndarray | None = None, batch_invariant: bool = False,
           in_perm: np.ndarray | None = None) -> "Linear":
        self = cls.__new__(cls)
        self.weight, self.bias, self.batch_invariant, self.in_perm = weight, bias, batch_invariant, in_perm
        self.name, self.lora = None, None
        return self

    @property
    def out_features(self) -> int:
        return self.weight.N

    def __call__(self, x: np.ndarray, rows=None, per_row: bool = False, scratch: np.ndarray | None = None,
                 dense_dtype: str | None = None):
        """rows: the batch's RowGroups, with its rows' LoRA slots (None: x is not the batch's rows, e.g. one
        expert's). per_row: every row runs the M = 1 kernel (rows of different sequences, e.g. sampled rows).
        scratch: f32 (T, N) the result of long prefill chunks may be written into (the caller's own buffer).
        dense_dtype: for rows that are not the batch's, the dense path's precision (default float32; MoE experts pass
        the model's, so that the formats' fastest prefill kernels run)."""
        x_in = x
        if self.in_perm is not None:
            x = np.take(x, self.in_perm, axis=-1)
        if self.weight.nbytes * x.shape[0] >= serial_work():
            y = self._matmul(x, rows, per_row, scratch, dense_dtype)  # common: no thread-count switch to enter
        else:
            with serial_if(True):
                y = self._matmul(x, rows, per_row, scratch, dense_dtype)
        if self.lora is not None:
            add_lora([(self.lora, 0)], x_in, y, rows)
        return y

    def _matmul(self, x: np.ndarray, rows, per_row: bool, scratch: np.ndarray | None = None,
                dense_dtype: str | None = None) -> np.ndarray:
        w, b = self.weight, self.bias
        if self.batch_invariant or per_row or rows is None or not rows.applies_to(x):
            dense = dense_dtype or ("float32" if rows is None or rows.dense_dtype == "auto" else rows.dense_dtype)
            return w.matmul(x, batch_invariant=self.batch_invariant or per_row, dense_dtype=dense, bias=b)
        if not rows.large:  # decodes and short chunks only
            return w.matmul(x, batch_invariant=True, bias=b)
        if len(rows.large) == 1 and not rows.small.size:  # one long prefill chunk
            return w.matmul(x, out=scratch, dense_dtype=rows.dense_dtype, bias=b)
        y = scratch if scratch is not None else np.empty((x.shape[0], w.N), np.float32)
        if rows.small.size:
            y[rows.small] = w.matmul(x[rows.small], batch_invariant=True, bias=b)
        return w.matmul_spans(x, rows.large, y, rows.dense_dtype, b)  # each long chunk on its own, W's tiles read once


def add_lora(parts: list, x: np.ndarray, y: np.ndarray, rows) -> None:
    """Adds the adapters' updates of the rows that have one (rows.lora_slots): parts [(SlotWeights, first column of
    y)], weights that read the same x, in one kernel call."""
    slots = getattr(rows, "lora_slots", None)
    if parts and slots is not None and rows.applies_to(x):
        add_parts(parts, x, y, slots, rows.lora_order)


# glibc serves requests up to 32 MiB from its heap and reuses them; larger ones are fresh mappings, faulted in page
# by page on every call: the 8B shape's 512-row gate|up output (59 MB) took ~480k page faults per prefill.
BIG_BYTES = 32 << 20
KEEP_BYTES = 256 << 20  # larger results (chunks of thousands of rows) stay fresh: a buffer held for good costs RAM
_scratch = threading.local()


def big_scratch(shape: tuple[int, int]) -> np.ndarray | None:
    """This thread's reused f32 buffer of `shape` when it is larger than BIG_BYTES (up to KEEP_BYTES), else None."""
    if not BIG_BYTES < shape[0] * shape[1] * 4 <= KEEP_BYTES:
        return None
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < shape[0] * shape[1]:
        buf = _scratch.buf = np.empty(shape[0] * shape[1], np.float32)
    return buf[:shape[0] * shape[1]].reshape(shape)


def prefill_scratch(x: np.ndarray, rows, width: int) -> np.ndarray | None:
    """big_scratch for a Linear's (T, width) result where the batch's rows hold long chunks (only those results
    are written into it: Linear._matmul), else None."""
    if rows is None or not rows.applies_to(x) or not len(rows.large):
        return None
    return big_scratch((x.shape[0], width))


class Projections:
    """Linears that read the same x (q/k/v, gate/up): those sharing a format and K run as one matmul over
    their weights stacked along N (a launch and a Python call less per part per layer); the parts' own
    weights then view the stacked rows, so nothing is held twice and the offload layer still sees them."""

    def __init__(self, owner, names: tuple[str, ...]):
        self.owner, self.names = owner, names
        self.parts = [getattr(owner, n) for n in names]
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(self.parts):
            w = p.weight
            stackable = w.fmt.repack_copies and w.N % w.fmt.row_block == 0  # views stay unstacked
            order = None if p.in_perm is None else p.in_perm.tobytes()  # one input order per matmul
            key = (w.ggml_type, w.K, p.batch_invariant, order) if stackable else (i,)
            groups.setdefault(key, []).append(i)
        self.groups = []  # (Linear, [(part index, first column, last column)])
        for idxs in groups.values():
            if len(idxs) == 1:
                p = self.parts[idxs[0]]
                self.groups.append((p, [(idxs[0], 0, p.out_features)]))
                continue
            members = [self.parts[i] for i in idxs]
            stacked = QuantLinear.stack([m.weight for m in members])
            bias = None
            if any(m.bias is not None for m in members):
                bias = np.concatenate([m.bias if m.bias is not None else np.zeros(m.out_features, np.float32)
                                       for m in members])
            fused = Linear.of(stacked, bias, members[0].batch_invariant, members[0].in_perm)
            spans, lo = [], 0
            for i, m in zip(idxs, members):
                hi = lo + m.out_features
                m.weight = stacked.rows(lo, hi)  # the part now views the stacked rows
                spans.append((i, lo, hi))
                lo = hi
            self.groups.append((fused, spans))

    def replaced(self) -> bool:
        """A part was replaced on the owner since (offload override): the stacked weights no longer apply."""
        return any(getattr(self.owner, n) is not p for n, p in zip(self.names, self.parts))

    def where(self) -> list[tuple[int, int]] | None:
        """Per part, (its group's index, its first column); None once a part was replaced."""
        if self.replaced():
            return None
        out = [None] * len(self.parts)
        for g, (_lin, spans) in enumerate(self.groups):
            for i, lo, _hi in spans:
                out[i] = (g, lo)
        return out

    def stacked(self, x: np.ndarray, rows) -> np.ndarray | None:
        """The parts' outputs side by side in one (T, sum N) array when they run as one matmul and are equally
        wide (the gated activations read the halves in place); None otherwise. A large result may live in this
        thread's scratch buffer (big_scratch): use it before the next call."""
        if len(self.groups) != 1 or self.replaced():
            return None
        lin, spans = self.groups[0]
        in_order = [i for i, _, _ in spans] == list(range(len(self.parts)))
        if len(spans) < 2 or not in_order or len({hi - lo for _, lo, hi in spans}) != 1:
            return None
        y = lin(x, rows, scratch=prefill_scratch(x, rows, lin.out_features))
        self._add_lora(x, y, rows, spans)
        return y

    def columns(self, x: np.ndarray, rows) -> list[tuple[np.ndarray, int]]:
        """Per part, (the C-contiguous output holding it, its first column): no copies of stacked parts."""
        if self.replaced():
            return [(np.ascontiguousarray(getattr(self.owner, n)(x, rows), dtype=np.float32), 0) for n in self.names]
        out = [None] * len(self.parts)
        for lin, spans in self.groups:
            y = lin(x, rows)
            if lin is not self.parts[spans[0][0]]:  # a part alone is its own Linear, which added its updates
                self._add_lora(x, y, rows, spans)
            for i, lo, _hi in spans:
                out[i] = (y, lo)
        return out

    def _add_lora(self, x: np.ndarray, y: np.ndarray, rows, spans) -> None:
        """The stacked parts' adapter updates, each into its columns of the stacked output, in one kernel call."""
        add_lora([(self.parts[i].lora, lo) for i, lo, _hi in spans if self.parts[i].lora is not None], x, y, rows)
