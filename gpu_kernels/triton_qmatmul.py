"""Triton matmul over GGUF-packed weights: y = x @ W^T with W dequantized tile by tile inside the kernel.

The packed rows never become a float tensor in device memory: each program reads its (BLOCK_K, BLOCK_N)
slice of the GGUF blocks, dequantizes it in registers (triton_dequant.py), rounds it and the x tile to the
compute dtype, and accumulates in float32. That is what wins for small M (decode), where the torch path's
dequantize-then-matmul writes and rereads a float copy of every weight tile. Importing this module imports
triton; gpu_kernels/linear.py imports it only when a Triton launch is due.
"""
from __future__ import annotations

import gguf
import torch
import triton
import triton.language as tl

from gpu_kernels.triton_dequant import FORMAT_IDS, dequant

DOT_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # the kernel's DOT constexpr


@triton.jit
def _qmatmul_kernel(x_ptr, w_ptr, out_ptr, M, N, K, row_bytes, stride_xm, stride_om,
                    FMT: tl.constexpr, QK: tl.constexpr, TYPE_SIZE: tl.constexpr, DOT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # x f32 (M, K) @ W (N, row_bytes) uint8 GGUF rows, dequantized -> out f32 (M, N); K % BLOCK_K == 0.
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    w_mask = tl.broadcast_to(n_ok[None, :], (BLOCK_K, BLOCK_N))
    w_rows = w_ptr + rn.to(tl.int64)[None, :] * row_bytes       # int64: a vocab-sized matrix passes 2 GiB
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None], other=0.0)
        blk = w_rows + ((k // QK) * TYPE_SIZE)[:, None]
        w = dequant(FMT, blk, (k % QK)[:, None], w_mask)        # (BLOCK_K, BLOCK_N) f32
        if DOT == 1:
            acc = tl.dot(x.to(tl.float16), w.to(tl.float16), acc)
        elif DOT == 2:
            acc = tl.dot(x.to(tl.bfloat16), w.to(tl.bfloat16), acc)
        else:
            acc = tl.dot(x, w, acc, input_precision="ieee")      # no TF32: float32 means float32
    out = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
    tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])


def has_triton_dequant(ggml_type) -> bool:
    return gguf.GGMLQuantizationType(ggml_type) in FORMAT_IDS


def launch_config(M: int, block_size: int) -> dict:
    """Tile sizes: 16 rows (tl.dot's minimum) and narrow N tiles for decode, so a GEMV still spreads its
    weight reads over many programs; bigger tiles once M grows."""
    if M <= 16:
        bm, bn = 16, 32
    else:
        bm, bn = (32, 64) if M <= 32 else (64, 64)
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32 if block_size == 32 else 64, "num_warps": 4}


def qmatmul(x: torch.Tensor, w: torch.Tensor, ggml_type, K: int, compute_dtype: torch.dtype = torch.float32
            ) -> torch.Tensor:
    """x f32 (M, K) @ W^T -> f32 (M, N).

    Args:
        w: the GGUF rows as stored, uint8 (N, row_bytes), on x's device.
        ggml_type: a block format with has_triton_dequant.
        compute_dtype: float32, float16 or bfloat16: x and W are rounded to it; accumulation is float32.
    """
    t = gguf.GGMLQuantizationType(ggml_type)
    qk, type_size = gguf.GGML_QUANT_SIZES[t]
    M, N = x.shape[0], w.shape[0]
    if x.shape[1] != K or K % qk or w.shape[1] != K // qk * type_size or w.dtype != torch.uint8:
        raise ValueError(f"qmatmul: x {tuple(x.shape)} and {t.name} rows {tuple(w.shape)} do not make K={K}")
    x = x.to(torch.float32).contiguous()
    w = w.contiguous()
    out = torch.empty((M, N), dtype=torch.float32, device=x.device)
    if M == 0 or N == 0:
        return out
    cfg = launch_config(M, qk)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]), triton.cdiv(N, cfg["BLOCK_N"]))
    # FP fusion off: the dequantized values then round exactly as gguf's numpy does.
    _qmatmul_kernel[grid](x, w, out, M, N, K, w.shape[1], x.stride(0), out.stride(0), FMT=FORMAT_IDS[t], QK=qk,
                          TYPE_SIZE=type_size, DOT=DOT_DTYPES[compute_dtype], enable_fp_fusion=False, **cfg)
    return out
