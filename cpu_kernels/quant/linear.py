"""QuantLinear: one (N, K) weight in any registered format, repacked once at load."""
from __future__ import annotations

import threading

import numpy as np

from cpu_kernels.activations import add_bias

from . import bf16_io, int8_gemm, packed_bf16
from .registry import QuantFormat, get_format
from .threads import match_torch_threads, serial_if, serial_work

# Up to this many rows, matmul runs the GEMV kernel per row (weights read from DRAM once, reused from
# L1 for every row); above it, weight tiles are dequantized to float32 and multiplied by torch.
# Measured here (2 threads, best of 7): Q4_K 4096x4096 M=16 4.5 vs 10.9 ms, M=64 16.8 vs 22.0 ms;
# Q5_0 2048x640 M=32 1.2 vs 2.8 ms, M=64 2.9 vs 1.7 ms.
GEMV_MAX_M = 32
# Rows of W dequantized per torch call on the prefill path: about this many weights per tile, in whole 256-row
# steps and at least MIN_TILE_ROWS: oneDNN's bf16 GEMM at M = 512 took 1.4-1.7x as long on 512-row tiles as on
# 1024-4096 (AMX host; K = 4096 and 14336).
TILE_ELEMS = 1 << 23
MIN_TILE_ROWS = 1024
# Precisions of the dense (prefill) path: float32 agrees with the GEMV to summation order; bfloat16 runs
# oneDNN's bf16 GEMM (AMX or AVX512-BF16, 3-6x faster here) and rounds inputs and outputs to bf16; int8 runs its
# int8 GEMM on rows quantized per row (int8_gemm.py, W8A8).
DENSE_DTYPES = ("auto", "float32", "bfloat16", "int8")


def auto_dense_dtype() -> str:
    """bfloat16 where oneDNN multiplies bf16 natively (AVX512-BF16 or AMX), else float32 (emulated bf16
    would be slower than float32; matmul then runs the formats marked gemv_prefill on the GEMV instead)."""
    global _AUTO
    if _AUTO is None:
        import torch
        try:
            native = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            native = False
        _AUTO = "bfloat16" if native else "float32"
    return _AUTO


_AUTO = None


_scratch = threading.local()


def _runs(spans) -> list[tuple[int, int]]:
    """Row spans (a, b) in order, adjacent ones joined."""
    out: list[list[int]] = []
    for a, b in spans:
        if out and out[-1][1] == a:
            out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _tile_buffer(n: int, dtype=np.float32, use: str = "buf") -> np.ndarray:
    """A reused buffer of n elements, one per thread, dtype and use: a fresh multi-MB array per call would
    pay its page faults again every time (about 0.1 ms per MB)."""
    key = use + "_" + np.dtype(dtype).name
    buf = getattr(_scratch, key, None)
    if buf is None or buf.size < n:
        buf = np.empty(n, dtype)
        setattr(_scratch, key, buf)
    return buf[:n]


class QuantLinear:
    """y = x @ W^T for a weight W (N, K) stored in a GGUF format.

    Attributes: N, K, ggml_type, nbytes (bytes held after repacking), fmt (its QuantFormat).
    """

    def __init__(self, fmt: QuantFormat, packed: tuple, N: int, K: int):
        self.fmt, self.packed, self.N, self.K = fmt, packed, N, K
        self.ggml_type = fmt.ggml_type
        self.nbytes = int(sum(a.nbytes for a in packed))

    @classmethod
    def from_raw(cls, ggml_type, raw: np.ndarray, shape: tuple[int, int]) -> "QuantLinear":
        """Repack a raw GGUF tensor.

        Args:
            ggml_type: gguf.GGMLQuantizationType of raw.
            raw: uint8 (N, bytes_per_row) as GGUF stores it, or for F32/F16/BF16 the typed (N, K)
                array (f32 / f16 / uint16 bits); a read-only memmap is fine (F32/F16/BF16 stay views).
            shape: (N, K) of the weight.
        """
        fmt = get_format(ggml_type)
        N, K = (int(s) for s in shape)
        if K % fmt.block_size:
            raise ValueError(f"{fmt.ggml_type.name}: row length {K} is not a multiple of {fmt.block_size}")
        raw = np.asarray(raw)
        if raw.nbytes != N * fmt.row_bytes(K):
            raise ValueError(f"{fmt.ggml_type.name} {shape}: expected {N * fmt.row_bytes(K)} bytes, got {raw.nbytes}")
        raw = raw.reshape(N, -1)
        return cls(fmt, tuple(fmt.repack(raw, K)), N, K)

    @classmethod
    def stack(cls, parts: list["QuantLinear"]) -> "QuantLinear":
        """One weight holding parts' rows one after another (same format and K; every part but the last a
        whole number of the format's row blocks): one kernel launch computes every part's outputs, each row
        exactly as its own part's kernel would."""
        fmt, K = parts[0].fmt, parts[0].K
        if any(p.fmt is not fmt or p.K != K for p in parts):
            raise ValueError("stack: parts must share the format and K")
        if any(p.N % fmt.row_block for p in parts[:-1]):
            raise ValueError(f"stack: {fmt.ggml_type.name} parts before the last need N % {fmt.row_block} == 0")
        packed = tuple(np.concatenate(arrs, axis=0) for arrs in zip(*(p.packed for p in parts)))
        return cls(fmt, packed, sum(p.N for p in parts), K)

    def rows(self, lo: int, hi: int) -> "QuantLinear":
        """The weight of rows lo:hi as views of this one's packed arrays (no copy); lo and hi (unless it is N)
        must be multiples of the format's row_block."""
        rb = self.fmt.row_block
        if not 0 <= lo < hi <= self.N or lo % rb or (hi % rb and hi != self.N):
            raise ValueError(f"rows: {lo}:{hi} is not a slice of whole {rb}-row blocks of N={self.N}")
        return QuantLinear(self.fmt, tuple(a[lo // rb:-(-hi // rb)] for a in self.packed), hi - lo, self.K)

    def __repr__(self) -> str:
        return f"QuantLinear({self.ggml_type.name}, N={self.N}, K={self.K}, {self.nbytes / 2**20:.1f} MiB)"

    def matmul(self, x: np.ndarray, out: np.ndarray | None = None, batch_invariant: bool = False,
               dense_dtype: str = "float32", bias: np.ndarray | None = None) -> np.ndarray:
        """x f32 (M, K) -> x @ W^T (+ bias) f32 (M, N) (a 1-D x gives a 1-D result).

        batch_invariant: every row of the result is bitwise what matmul of that row alone gives
        (the M = 1 kernel runs for each row); otherwise large M takes the faster dense path.
        dense_dtype: the dense path's precision, one of DENSE_DTYPES.
        bias: f32 (N,) added to every row (the bf16 dense path adds it as it widens its product).
        """
        if (out is None and type(x) is np.ndarray and x.ndim == 2 and x.dtype == np.float32 and x.shape[1] == self.K
                and 0 < x.shape[0] and (batch_invariant or x.shape[0] <= GEMV_MAX_M) and x.flags.c_contiguous):
            y = np.empty((x.shape[0], self.N), np.float32)  # the decode path, without the general case's steps
            self.fmt.gemv(*self.packed, x, y)
            return y if bias is None else add_bias(y, bias)
        x = np.asarray(x)
        squeeze = x.ndim == 1
        if x.ndim not in (1, 2) or x.shape[-1] != self.K:
            raise ValueError(f"matmul: x of shape {x.shape} does not match the weight's K={self.K}")
        x2 = np.ascontiguousarray(x[None, :] if squeeze else x, dtype=np.float32)
        M = x2.shape[0]
        direct = (out is not None and out.dtype == np.float32 and out.flags.c_contiguous
                  and out.shape in ((M, self.N),) + (((self.N,),) if squeeze else ()))
        y = out.reshape(M, self.N) if direct else np.empty((M, self.N), np.float32)
        dtype = None if M == 0 or batch_invariant or M <= GEMV_MAX_M else self._dense_path(dense_dtype)
        if M == 0:
            pass
        elif dtype is None:  # GEMV rows (and formats whose GEMV beats the GEMM here: QuantFormat.gemv_prefill)
            self.fmt.gemv(*self.packed, x2, y)
            if bias is not None:
                add_bias(y, bias)
        else:
            self._matmul_dense(x2, y, dtype, bias=bias)
        if out is not None and not direct:
            out[...] = y.reshape(out.shape)
            return out
        if out is not None:
            return out
        return y[0] if squeeze else y

    def matmul_spans(self, x: np.ndarray, spans: list[tuple[int, int]], y: np.ndarray, dense_dtype: str = "float32",
                     bias: np.ndarray | None = None):
        """y[a:b] = matmul(x[a:b], dense_dtype=dense_dtype, bias=bias) bit for bit for each (a, b) in spans (each longer
        than GEMV_MAX_M: a step's long prompts), with each tile of W dequantized once for all of them.

        Args: x f32 (M, K); y f32 (M, N) C-contiguous, written in the spans' rows only.
        """
        x = np.ascontiguousarray(x, dtype=np.float32)
        if any(b - a <= GEMV_MAX_M for a, b in spans) or x.shape[1] != self.K or y.shape != (x.shape[0], self.N):
            raise ValueError("matmul_spans: spans of more than GEMV_MAX_M rows of x (M, K) and y (M, N)")
        dtype = self._dense_path(dense_dtype)
        if dtype is None:
            for a, b in spans:
                self.fmt.gemv(*self.packed, x[a:b], y[a:b])
                if bias is not None:
                    add_bias(y[a:b], bias)
        else:
            self._matmul_dense(x, y, dtype, spans, bias)
        return y

    def _dense_path(self, dense_dtype: str) -> str | None:
        """The precision of the dense path for more than GEMV_MAX_M rows, or None where this format's GEMV is faster
        (dense_dtype auto and QuantFormat.gemv_prefill)."""
        if dense_dtype not in DENSE_DTYPES:
            raise ValueError(f"matmul: dense_dtype must be one of {DENSE_DTYPES}, got {dense_dtype!r}")
        dtype = auto_dense_dtype() if dense_dtype == "auto" else dense_dtype
        fmt = self.fmt
        if dense_dtype == "auto" and fmt.gemv_prefill and (dtype == "float32" or 0 < fmt.gemv_prefill_min_k <= self.K):
            return None
        return dtype

    def _matmul_dense(self, x: np.ndarray, y: np.ndarray, dtype: str, spans=None, bias=None) -> None:
        """Prefill through torch, W dequantized tile by tile by the format's kernel; spans: the row ranges (a, b) of x
        multiplied each on its own (default: all of x), every tile serving them all; bias added to those rows.

        float32: quantized formats see x rounded to Q8 per 32-block exactly as the GEMV path rounds it, and
        W in float32 (exact), so both paths agree to float32 summation order: a row's answer does not
        depend on whether it ran alone or in a long prompt.
        bfloat16: oneDNN's bf16 GEMM; W tiles dequantized straight to bf16 bits (F32 weights: packed_bf16's kept
        copy), x rounded to bf16, fp32 accumulation, the product rounded to bf16 (torch's CPU matmul has no fp32
        output for bf16 inputs): about 0.2 % relative error per output, 2.5x faster here.
        """
        import torch

        match_torch_threads(torch)
        spans = spans or ((0, x.shape[0]),)
        if dtype == "int8":
            self._matmul_int8(torch, x, y, spans, bias)
            return
        bf16 = dtype == "bfloat16"
        yt = torch.from_numpy(y)
        if bf16:  # rounded on every core (torch's .to ran ~5x slower here), nearest even as torch rounds
            xt = torch.from_numpy(bf16_io.to_bf16(x)).view(torch.bfloat16)
            runs = _runs(spans)  # oneDNN's bf16 rows do not depend on M: adjacent spans in one call
            wp = packed_bf16.packed_weight(self)
            if wp is not None:
                packed_bf16.matmul_into(wp, xt, runs, y, bias)
                return
        else:
            xt = torch.from_numpy(q8_roundtrip(x) if self.fmt.int8_activations else x)
        tile = min(self.N, max(MIN_TILE_ROWS, TILE_ELEMS // self.K // 256 * 256))
        buf = _tile_buffer(tile * self.K, np.uint16 if bf16 else np.float32).reshape(tile, self.K)
        rows = np.arange(self.N, dtype=np.int64)
        for lo in range(0, self.N, tile):
            hi = min(self.N, lo + tile)
            w = buf[:hi - lo]
            self.fmt.dequant(*self.packed, rows[lo:hi], w)
            wt = torch.from_numpy(w).view(torch.bfloat16) if bf16 else torch.from_numpy(w)
            if bf16:  # each run of spans' bf16 product into one buffer, widened into y (+ bias) while still cached
                prod = torch.from_numpy(_tile_buffer(x.shape[0] * (hi - lo), np.uint16, "prod")).view(
                    torch.bfloat16).reshape(x.shape[0], hi - lo)
                bits = prod.view(torch.int16).numpy().view(np.uint16)
                for a, b in runs:
                    torch.mm(xt[a:b], wt.T, out=prod[a:b])
                    bf16_io.from_bf16(bits[a:b], y, a, lo, bias)
                continue
            for a, b in spans:
                if hi - lo == self.N:
                    torch.mm(xt[a:b], wt.T, out=yt[a:b])
                else:
                    yt[a:b, lo:hi].copy_(torch.mm(xt[a:b], wt.T))
        if bias is not None and not bf16:
            for a, b in spans:
                add_bias(y[a:b], bias)

    def _matmul_int8(self, torch, x: np.ndarray, y: np.ndarray, spans, bias) -> None:
        """W8A8: x's rows and W's rows quantized per row to int8, int32 sums by oneDNN, scaled back (+ bias)."""
        wq, sw = self.int8_rows()
        xq, sx = int8_gemm.quantize_rows(x)
        wt = torch.from_numpy(wq).T
        for a, b in spans:
            acc = torch._int_mm(torch.from_numpy(xq[a:b]), wt).numpy()
            int8_gemm.dequantize_into(acc, sx[a:b], sw, y, a, bias)

    def int8_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """W's rows quantized per row to int8 (N, K) with their scales (N,): made from W's values at the first int8
        prefill and kept (N x K bytes more)."""
        got = getattr(self, "_int8", None)
        if got is None:
            wq, sw = np.empty((self.N, self.K), np.int8), np.empty(self.N, np.float32)
            tile = max(1, min(self.N, TILE_ELEMS // self.K))
            for lo in range(0, self.N, tile):
                hi = min(self.N, lo + tile)
                wq[lo:hi], sw[lo:hi] = int8_gemm.quantize_rows(self.embed(np.arange(lo, hi)))
            got = self._int8 = (wq, sw)
        return got

    def dequantize(self) -> np.ndarray:
        """The whole weight as float32 (N, K)."""
        return self.embed(np.arange(self.N, dtype=np.int64))

    def embed(self, ids) -> np.ndarray:
        """Rows `ids` (T,) of W as float32 (T, K): a token-embedding lookup; only those rows are read."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.N):
            raise IndexError(f"embed: ids must lie in [0, {self.N}), got {ids.min()}..{ids.max()}")
        out = np.empty((ids.shape[0], self.K), np.float32)
        if ids.size:
            with serial_if(out.nbytes < serial_work()):  # one decode token's row: no parallel launch
                self.fmt.dequant(*self.packed, ids, out)
        return out


def q8_roundtrip(x: np.ndarray) -> np.ndarray:
    """x f32 (M, K) as the GEMV kernels see it: round(x / d) * d per 32-block, d = amax / 127 (f32 ops
    in quantize_act's order)."""
    M, K = x.shape
    xb = x.reshape(M, K // 32, 32)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    return (np.rint(xb * inv) * d).astype(np.float32).reshape(M, K)


RELEASE_BYTES = 64 << 20  # stacked_experts hands back the file's pages this often (peak RSS: the file + this)


def stacked_experts(ggml_type, raw: np.ndarray, shape: tuple[int, int, int],
                    repacked=None) -> tuple[tuple, list[QuantLinear]]:
    """E experts' (N, K) weights from one stacked GGUF tensor (raw (E, N, row bytes), or typed for float formats),
    repacked once into arrays with a leading expert axis. repacked(lo, hi), if given, is told the raw bytes
    [lo, hi) are done with, every RELEASE_BYTES or so (a big tensor's mapped pages then leave RSS as it goes).

    Returns:
        (the packed arrays (E, ...) in the format's field order, one QuantLinear per expert viewing them).
    """
    fmt = get_format(ggml_type)
    E, N, K = (int(s) for s in shape)
    raw = np.asarray(raw).reshape(E, N, -1)
    if not fmt.repack_copies:  # float formats: views of the file, reshaped, no copy
        flat = QuantLinear.from_raw(ggml_type, raw.reshape(E * N, -1), (E * N, K))
        arrays = tuple(a.reshape(E, -1, *a.shape[1:]) for a in flat.packed)
    else:
        arrays, per, done = None, raw[0].nbytes, 0
        for e in range(E):
            one = QuantLinear.from_raw(ggml_type, raw[e], (N, K)).packed
            if arrays is None:
                arrays = tuple(np.empty((E, *a.shape), a.dtype) for a in one)
            for dst, src in zip(arrays, one):
                dst[e] = src
            if repacked is not None and ((e + 1) * per - done >= RELEASE_BYTES or e == E - 1):
                repacked(done, (e + 1) * per)
                done = (e + 1) * per
    return arrays, [QuantLinear(fmt, tuple(a[e] for a in arrays), N, K) for e in range(E)]
