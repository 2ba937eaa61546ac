"""Weights and linear layers on a torch device: dense (dequantized once), packed (GGUF blocks kept in
device memory, dequantized tile by tile at each call) or streamed (kept in RAM, copied in per call).

Packed block formats with few rows run the Triton kernel (triton_qmatmul.py, dequantized in registers)
where triton_dispatch allows it; everything else is torch.
"""
from __future__ import annotations

import warnings

import gguf
import numpy as np
import torch

from cpu_kernels.quant.qtypes import qtype
from gpu_kernels import triton_dispatch
from gpu_kernels.dequant import DEQUANT, FLOAT_TYPES, dequantize_rows, has_device_dequant

Q = gguf.GGMLQuantizationType
TILE_ELEMS = 1 << 24       # weights dequantized per step on the packed path (32 MiB in bf16)
UPLOAD_TILE_ELEMS = 1 << 24  # rows dequantized on the host per upload step when placing dense weights
# Rows up to which the in-kernel dequantizing Triton matmul replaces dequantize-then-matmul: one row tile
# reads each weight once; past it every row tile dequantizes again (a first guess, not yet timed on a GPU).
TRITON_MAX_M = 64

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A torch view of a numpy array, read-only ones (the GGUF memory map) included: weights are never
    written, so the view is safe; torch only warns because it cannot mark a tensor read-only."""
    if a.dtype == np.uint16:  # bf16 bits
        a = a.view(np.int16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(a)
    return t


def typed_raw(raw: np.ndarray, ggml_type) -> torch.Tensor:
    """GGUF raw rows as a CPU tensor (a view of the map): uint8 for block formats, typed for floats."""
    t = from_numpy(raw)
    if qtype(ggml_type) == Q.BF16:
        t = t.view(torch.bfloat16)
    return t


class DeviceWeight:
    """One (N, K) weight for a device.

    kind "dense": `data` is (N, K) in a float dtype; "packed": `data` holds the GGUF rows (uint8
    (N, row_bytes) or typed (N, K) for F32/F16/BF16). `data` lives on `device`, or in RAM (pinned on CUDA)
    when streamed; then every call copies it in first.
    """

    def __init__(self, data: torch.Tensor, kind: str, ggml_type, N: int, K: int, device: torch.device,
                 compute_dtype: torch.dtype, streamed: bool = False):
        self.data, self.kind, self.ggml_type, self.N, self.K = data, kind, ggml_type, N, K
        self.device, self.compute_dtype = device, compute_dtype
        self.streamed = streamed or data.device != device
        # what the Triton matmul takes: GGML's block formats (ramlm's own dequantize through torch)
        self.block_packed = kind == "packed" and isinstance(qtype(ggml_type), Q) and qtype(ggml_type) in DEQUANT

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @classmethod
    def build(cls, qlinear, raw: np.ndarray | None, fmt: str, device: torch.device, compute_dtype: torch.dtype,
              streamed: bool = False) -> "DeviceWeight":
        """From a cpu_kernels QuantLinear (dense: dequantized with QuantLinear.embed, in row tiles so a big
        matrix never needs a float32 copy of itself) or its raw GGUF rows (packed).

        fmt: "packed" or a dtype name (float32, float16, bfloat16)."""
        N, K, t = qlinear.N, qlinear.K, qlinear.ggml_type
        home = torch.device("cpu") if streamed else device
        if fmt == "packed" and raw is not None and has_device_dequant(t):
            data = typed_raw(raw.reshape(N, -1), t)
            if home.type != "cpu":
                data = data.to(home)
            elif streamed and device.type == "cuda":
                data = data.pin_memory()
            return cls(data, "packed", t, N, K, device, compute_dtype, streamed)
        dtype = DTYPES.get(fmt, compute_dtype)
        data = torch.empty((N, K), dtype=dtype, device=home, pin_memory=streamed and device.type == "cuda")
        step = max(1, UPLOAD_TILE_ELEMS // K)
        for lo in range(0, N, step):
            hi = min(N, lo + step)
            rows = qlinear.embed(np.arange(lo, hi, dtype=np.int64))
            data[lo:hi].copy_(torch.from_numpy(rows).to(dtype))
        return cls(data, "dense", t, N, K, device, dtype, streamed)  # dense weights compute in their own dtype

    def on_device(self) -> torch.Tensor:
        return self.data.to(self.device, non_blocking=True) if self.streamed else self.data

    def rows(self, lo: int, hi: int, data: torch.Tensor | None = None) -> torch.Tensor:
        """W[lo:hi] in the compute dtype (dequantized if packed)."""
        d = self.on_device() if data is None else data
        if self.kind == "dense":
            return d[lo:hi].to(self.compute_dtype)
        return dequantize_rows(d[lo:hi], self.ggml_type, self.K, self.compute_dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x f32 (M, K) -> x @ W^T f32 (M, N)."""
        if self.block_packed and x.shape[0] <= TRITON_MAX_M:
            return triton_dispatch.run("qmatmul", self.device, lambda: self.matmul_triton(x),
                                       lambda: self.matmul_torch(x))
        return self.matmul_torch(x)

    def matmul_triton(self, x: torch.Tensor) -> torch.Tensor:
        """x f32 (M, K) -> x @ W^T f32 (M, N) by the Triton kernel (packed block formats only)."""
        from gpu_kernels.triton_qmatmul import qmatmul
        return qmatmul(x, self.on_device(), self.ggml_type, self.K, self.compute_dtype)

    def matmul_torch(self, x: torch.Tensor) -> torch.Tensor:
        """x f32 (M, K) -> x @ W^T f32 (M, N) with torch ops only."""
        data = self.on_device()
        xc = x.to(self.compute_dtype)
        if self.kind == "dense":
            return torch.matmul(xc, data.to(self.compute_dtype).T).to(torch.float32)
        out = torch.empty((x.shape[0], self.N), dtype=torch.float32, device=self.device)
        step = max(1, TILE_ELEMS // self.K)
        for lo in range(0, self.N, step):
            hi = min(self.N, lo + step)
            out[:, lo:hi] = torch.matmul(xc, self.rows(lo, hi, data).T)
        return out


class DeviceLinear:
    """y = x @ W^T (+ b) on a torch device; x and y float32 tensors. in_perm: the order an act-order weight stores
    its inputs in (x is gathered so first)."""

    def __init__(self, weight: DeviceWeight, bias: torch.Tensor | None = None, in_perm: torch.Tensor | None = None):
        self.weight, self.bias, self.in_perm = weight, bias, in_perm

    @property
    def out_features(self) -> int:
        return self.weight.N

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_perm is not None:
            x = x.index_select(-1, self.in_perm)
        y = self.weight.matmul(x)
        return y + self.bias if self.bias is not None else y


def storage_kind(ggml_type, fmt: str) -> str:
    """What a weight of this type becomes under `fmt` (the planner counts bytes by it)."""
    if fmt == "packed" and has_device_dequant(ggml_type):
        return "packed"
    return "dense"


__all__ = ["DeviceWeight", "DeviceLinear", "DTYPES", "FLOAT_TYPES", "from_numpy", "typed_raw", "storage_kind"]
