"""Building blocks shared by the architecture files: each holds its weights and calls cpu_kernels."""
from __future__ import annotations

import threading

import numpy as np

from cpu_kernels import activations, attention, attention_sdpa, norms, rope
from cpu_kernels.attn_inputs import attn_inputs
from cpu_kernels.bf16x32 import HAS_BF16_DOT
from cpu_kernels.quant.linear import GEMV_MAX_M, QuantLinear
from cpu_kernels.quant.threads import serial_if, serial_work
from engine.worker.batch import BatchMetadata
from engine.model.config import ModelConfig


def vector(ws, name: str) -> np.ndarray:
    """A 1-D weight (norm scale, bias) as contiguous float32."""
    raw = ws.raw(name)
    if raw.dtype == np.uint16:  # bf16 bits
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(-1).copy()
    return np.ascontiguousarray(raw, dtype=np.float32).reshape(-1)


def has(ws, name: str) -> bool:
    return name in ws.names()


class RowGroups:
    """The current batch's rows grouped by sequence, so that a row's result does not depend on its batch:
    rows of short groups (decodes, small chunks) all run the per-row GEMV kernel, and each long prefill
    chunk takes the dense path on its own rows only. Set by DecoderModel.forward for one pass."""

    def __init__(self, query_start_loc: np.ndarray | None = None, dense_dtype: str = "auto"):
        self.dense_dtype = dense_dtype  # precision of the long chunks' dense path (QuantLinear.DENSE_DTYPES)
        self.num_rows = -1
        self.small = None
        self.large: list[tuple[int, int]] = []
        self.long_seqs = np.zeros(0, np.uint8)  # per sequence: 1 where its chunk is long
        if query_start_loc is None:
            return
        q = np.asarray(query_start_loc, dtype=np.int64)
        lens = np.diff(q)
        self.long_seqs = (lens > GEMV_MAX_M).astype(np.uint8)
        self.num_rows = int(q[-1])
        small = [np.arange(a, b) for a, b, n in zip(q[:-1], q[1:], lens) if 0 < n <= GEMV_MAX_M]
        self.small = np.concatenate(small) if small else np.empty(0, np.int64)
        self.large = [(int(a), int(b)) for a, b, n in zip(q[:-1], q[1:], lens) if n > GEMV_MAX_M]

    def applies_to(self, x: np.ndarray) -> bool:
        return x.shape[0] == self.num_rows

    def bf16_attention(self, x: np.ndarray) -> np.ndarray | None:
        """The long chunks' flags for paged_attention's bf16_seqs where their matmuls may run in bf16 (dense_dtype
        auto or bfloat16) and the CPU has AVX512-BF16 dot products; None where no sequence qualifies."""
        if (not self.large or self.dense_dtype == "float32" or not HAS_BF16_DOT or not self.applies_to(x)):
            return None
        return self.long_seqs


ROWS = RowGroups()


class Linear:
    """y = x @ W^T (+ b) over a quantized or float weight stored (N, K)."""

    def __init__(self, ws, name: str, bias: str | None = None, batch_invariant: bool = False):
        info = ws.info(name)
        n, k = info.shape[-2], info.shape[-1]
        self.weight = QuantLinear.from_raw(info.ggml_type, ws.raw(name), (n, k))
        if self.weight.fmt.repack_copies:
            ws.release(name)  # repacked into RAM: the file's pages need not stay in RSS (peak RSS ~1x the file)
        self.bias = vector(ws, bias) if bias and has(ws, bias) else None
        self.batch_invariant = batch_invariant

    @classmethod
    def from_raw(cls, ggml_type, raw, shape, batch_invariant=False) -> "Linear":
        self = cls.__new__(cls)
        self.weight = QuantLinear.from_raw(ggml_type, raw, shape)
        self.bias = None
        self.batch_invariant = batch_invariant
        return self

    @property
    def out_features(self) -> int:
        return self.weight.N

    def __call__(self, x: np.ndarray, per_row: bool = False, scratch: np.ndarray | None = None) -> np.ndarray:
        """per_row: every row runs the M = 1 kernel (rows of different sequences, e.g. sampled rows).
        scratch: f32 (T, N) the result of a long prefill chunk may be written into (the caller's own buffer)."""
        if self.weight.nbytes * x.shape[0] >= serial_work():
            return self._matmul(x, per_row, scratch)  # the common case: no thread-count switch to enter
        with serial_if(True):
            return self._matmul(x, per_row, scratch)

    def _matmul(self, x: np.ndarray, per_row: bool, scratch: np.ndarray | None = None) -> np.ndarray:
        w, rows = self.weight, ROWS
        if self.batch_invariant or per_row or not rows.applies_to(x):
            y = w.matmul(x, batch_invariant=self.batch_invariant or per_row)
        elif not rows.large:  # decodes and short chunks only
            y = w.matmul(x, batch_invariant=True)
        elif len(rows.large) == 1 and not rows.small.size:  # one long prefill chunk
            y = w.matmul(x, out=scratch, dense_dtype=rows.dense_dtype)
        else:
            y = np.empty((x.shape[0], w.N), np.float32)
            if rows.small.size:
                y[rows.small] = w.matmul(x[rows.small], batch_invariant=True)
            for a, b in rows.large:
                y[a:b] = w.matmul(x[a:b], dense_dtype=rows.dense_dtype)
        if self.bias is not None:
            y += self.bias
        return y


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
            key = (w.ggml_type, w.K, p.batch_invariant) if stackable else (i,)
            groups.setdefault(key, []).append(i)
        self.groups = []  # (Linear, [(part index, first column, last column)])
        for idxs in groups.values():
            if len(idxs) == 1:
                p = self.parts[idxs[0]]
                self.groups.append((p, [(idxs[0], 0, p.out_features)]))
                continue
            members = [self.parts[i] for i in idxs]
            stacked = QuantLinear.stack([m.weight for m in members])
            fused = Linear.__new__(Linear)
            fused.weight, fused.batch_invariant = stacked, members[0].batch_invariant
            fused.bias = None
            if any(m.bias is not None for m in members):
                fused.bias = np.concatenate([m.bias if m.bias is not None else np.zeros(m.out_features, np.float32)
                                             for m in members])
            spans, lo = [], 0
            for i, m in zip(idxs, members):
                hi = lo + m.out_features
                m.weight = stacked.rows(lo, hi)  # the part now views the stacked rows
                spans.append((i, lo, hi))
                lo = hi
            self.groups.append((fused, spans))

    def _replaced(self) -> bool:
        """A part was replaced on the owner since (offload override): the stacked weights no longer apply."""
        return any(getattr(self.owner, n) is not p for n, p in zip(self.names, self.parts))

    def stacked(self, x: np.ndarray) -> np.ndarray | None:
        """The parts' outputs side by side in one (T, sum N) array when they run as one matmul and are equally
        wide (the gated activations read the halves in place); None otherwise. A large result may live in this
        thread's scratch buffer (big_scratch): use it before the next call."""
        if len(self.groups) != 1 or self._replaced():
            return None
        lin, spans = self.groups[0]
        in_order = [i for i, _, _ in spans] == list(range(len(self.parts)))
        if len(spans) < 2 or not in_order or len({hi - lo for _, lo, hi in spans}) != 1:
            return None
        rows = ROWS  # only one long chunk alone writes into scratch (Linear._matmul): no buffer for the others
        one_chunk = rows.applies_to(x) and len(rows.large) == 1 and not rows.small.size
        return lin(x, scratch=big_scratch((x.shape[0], lin.out_features)) if one_chunk else None)

    def columns(self, x: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """Per part, (the C-contiguous output holding it, its first column): no copies of stacked parts."""
        if self._replaced():
            return [(np.ascontiguousarray(getattr(self.owner, n)(x), dtype=np.float32), 0) for n in self.names]
        out = [None] * len(self.parts)
        for lin, spans in self.groups:
            y = lin(x)
            for i, lo, _hi in spans:
                out[i] = (y, lo)
        return out

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        if self._replaced():
            return [getattr(self.owner, n)(x) for n in self.names]
        out = [None] * len(self.parts)
        for lin, spans in self.groups:
            y = lin(x)
            for i, lo, hi in spans:
                out[i] = y if len(spans) == 1 else y[:, lo:hi]
        return out


def small_on_one_thread(a: np.ndarray) -> serial_if:
    """Runs an elementwise kernel over a on the calling thread when a is small: the kernels' own row
    thresholds launch the pool for a 16-row decode step, and each launch waits for a time slice while
    another process is busy (a served 16-row step spent 19 % of its time in RMSNorm's barriers)."""
    return serial_if(a.nbytes < serial_work())


class RMSNorm:
    def __init__(self, ws, name: str, eps: float):
        self.weight = np.array(vector(ws, name))  # writable: one kernel signature for file and converted weights
        self.eps = float(eps)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        # Per-head norm (QK-norm) of (T, H, D): normalize over the last axis, as (T * H, D) rows.
        x2 = x if x.ndim == 2 else np.ascontiguousarray(x).reshape(-1, x.shape[-1])
        if x2.shape[0] < norms.PAR_MIN_ROWS:  # rms_norm runs serially anyway: no thread switch to enter
            y = norms.rms_norm(x2, self.weight, self.eps)
        else:
            with small_on_one_thread(x2):
                y = norms.rms_norm(x2, self.weight, self.eps)
        return y if x.ndim == 2 else y.reshape(x.shape)


_NO_NORM = np.empty(0, np.float32)


def add_and_norm(x: np.ndarray, y: np.ndarray, post: RMSNorm | None, nxt: RMSNorm | None):
    """(x + post(y), nxt(x + post(y))) in one kernel (post None: x + y; nxt None: the second is empty): a block's
    residual step without a launch and a Python call per part; the bits of the parts called one by one."""
    x, y = np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.float32)
    pw, pe = (post.weight, post.eps) if post is not None else (_NO_NORM, 0.0)
    nw, ne = (nxt.weight, nxt.eps) if nxt is not None else (_NO_NORM, 0.0)
    if x.shape[0] < norms.PAR_MIN_ROWS:
        return norms.residual_rms_norm(x, y, pw, nw, pe, ne)
    with small_on_one_thread(x):
        return norms.residual_rms_norm(x, y, pw, nw, pe, ne)


class Attention:
    """Self-attention over the paged KV cache; optional QK-norm, bias, sliding window and softcap."""

    def __init__(self, ws, cfg: ModelConfig, layer: int, qkv_bias: bool = False, qk_norm: bool = False,
                 inv_freq: np.ndarray | None = None, mscale: float = 1.0, batch_invariant: bool = False):
        p = f"blk.{layer}."
        bi = batch_invariant
        self.q = Linear(ws, p + "attn_q.weight", p + "attn_q.bias" if qkv_bias else None, bi)
        self.k = Linear(ws, p + "attn_k.weight", p + "attn_k.bias" if qkv_bias else None, bi)
        self.v = Linear(ws, p + "attn_v.weight", p + "attn_v.bias" if qkv_bias else None, bi)
        self.o = Linear(ws, p + "attn_output.weight", None, bi)
        self.q_norm = RMSNorm(ws, p + "attn_q_norm.weight", cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(ws, p + "attn_k_norm.weight", cfg.rms_norm_eps) if qk_norm else None
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.batch_invariant = batch_invariant
        self.scale = cfg.attn_scale or cfg.head_dim ** -0.5
        self.sliding_window = cfg.sliding_window(layer)
        self.softcap = cfg.attn_logit_softcap
        self.neox = cfg.rope_neox
        self.inv_freq, self.mscale = inv_freq, mscale
        self.qkv = Projections(self, ("q", "k", "v"))

    def __call__(self, x: np.ndarray, meta: BatchMetadata, kv: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        t = x.shape[0]
        qc, kc, vc = self.qkv.columns(x)
        k_cache, v_cache = kv
        norms_ = (None, None) if self.q_norm is None else ((self.q_norm.weight, self.q_norm.eps),
                                                           (self.k_norm.weight, self.k_norm.eps))
        with small_on_one_thread(qc[0]):
            cos, sin = rope_table(meta, self.inv_freq, self.mscale)
            q = attn_inputs(qc, kc, vc, self.num_heads, *norms_, cos, sin, self.neox, k_cache, v_cache,
                            meta.slot_mapping)
        # Work ~ query rows x context x heads x head_dim (a decode over a short context is tiny).
        work = t * meta.max_seq_len * self.num_heads * self.head_dim
        long_seqs = None if self.batch_invariant else ROWS.bf16_attention(x)
        if long_seqs is not None and not self.softcap and attention_sdpa.enabled():
            out = attention_sdpa.mixed_attention(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                                 meta.block_tables, self.scale, self.sliding_window, long_seqs)
        else:
            with serial_if(work < serial_work()):
                out = attention.paged_attention(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                                meta.block_tables, self.scale, self.sliding_window, self.softcap,
                                                long_seqs)
        return self.o(out.reshape(t, self.num_heads * self.head_dim))


class GatedMLP:
    """down(act(gate(x)) * up(x)) with SiLU or tanh-GELU."""

    def __init__(self, ws, prefix: str, act: str, batch_invariant: bool = False):
        self.gate = Linear(ws, prefix + "ffn_gate.weight", None, batch_invariant)
        self.up = Linear(ws, prefix + "ffn_up.weight", None, batch_invariant)
        self.down = Linear(ws, prefix + "ffn_down.weight", None, batch_invariant)
        self.act = activations.gelu_tanh_mul if act == "gelu_tanh" else activations.silu_mul
        self.gate_up = Projections(self, ("gate", "up"))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = self.gate_up.stacked(x)
        if y is not None:  # gate|up in one matmul output: the activation reads its halves in place
            with small_on_one_thread(y):
                h = activations.HALVES[self.act](y)
        else:
            g, u = self.gate_up(x)
            with small_on_one_thread(g):
                h = self.act(g, u)
        return self.down(h)


def rope_table(meta: BatchMetadata, inv_freq: np.ndarray, mscale: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of the step's positions for one RoPE base: computed by the first layer, shared by the rest."""
    key = ("rope", id(inv_freq), mscale)
    table = meta.step_cache.get(key)
    if table is None:
        table = meta.step_cache[key] = rope.rope_cos_sin(meta.positions, inv_freq, mscale)
    return table


def rope_tables(cfg: ModelConfig, theta: float, ws=None) -> tuple[np.ndarray, float]:
    """inv_freq and mscale for one RoPE base; llama.cpp's rope_freqs tensor (Llama 3.1) divides inv_freq."""
    inv_freq, mscale = rope.rope_inv_freq(cfg.head_dim, theta, cfg.rope_scaling)
    if ws is not None and has(ws, "rope_freqs.weight"):
        inv_freq = (inv_freq / vector(ws, "rope_freqs.weight")).astype(np.float32)
    return np.ascontiguousarray(inv_freq, dtype=np.float32), mscale
