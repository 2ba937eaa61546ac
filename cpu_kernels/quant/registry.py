"""The quantization formats, as data: FORMATS[GGMLQuantizationType | RamlmType] -> QuantFormat.

Tests iterate over FORMATS, so a format is tested the moment it is registered here. The numpy
oracle for every format is qtypes.dequantize(raw, ggml_type) (gguf.quants.dequantize for GGML's types).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as Q

from . import (k_a16, k_bytes, k_float, k_fp8, k_grid, k_grid_pairs, k_iq4, k_kquants, k_kquants_x8, k_legacy,
               k_lowbit, k_mxfp4, k_q6_k_x8, k_zero_point, repack)
from .qtypes import QUANT_SIZES, RamlmType, qtype
from .simd import AMX
from .wide import PAIR


def _grid_gemv(t: Q):
    """The GEMV of grid type t: k_grid_pairs' 512-bit one where the host has it, else k_grid's."""
    name = "gemv_" + t.name.lower()
    return getattr(k_grid_pairs, name) if PAIR and hasattr(k_grid_pairs, name) else getattr(k_grid, name)


@dataclass(frozen=True)
class QuantFormat:
    """One weight format.

    block_size elements are stored in type_size bytes (qtypes.QUANT_SIZES).
    repack(raw uint8 (N, row_bytes) or typed (N, K), K) -> tuple of arrays (`fields`, in order).
    gemv(*packed, x f32 (M, K) C-contiguous, out f32 (M, N) C-contiguous): out = x @ W^T, each
        output element computed the same way whatever M is (Numba, parallel over rows of W).
    dequant(*packed, rows int64 (T,), out f32 (T, K)): out[t] = W[rows[t]], bit-equal to gguf's;
        a uint16 out receives those values rounded to bfloat16 bits.
    int8_activations: gemv quantizes x to int8 per 32-block first (about 0.5 % relative error).
    repack_copies: repack copies raw into new arrays (False: the packed arrays are views of raw, i.e. of
        the mapped file, so the file's pages stay in use and stacking them would copy them into RAM).
    row_block: rows of W per entry of the packed arrays' first axis (8 where rows are interleaved; the last
        entry may hold fewer real rows).
    gemv_prefill: without native bf16, long prefill chunks run the GEMV rather than float32 GEMM (measured faster
        on a Zen 3 host at M = 64..512: Q4_K 1.7-3.2x on gemma and 8B shapes, Q5_0 1.1-2.5x; since the GEMVs
        unpack each row group once, Q6_K and Q8_0 too: 2-2.6x with the AVX2 lowering at M = 128..512).
    gemv_prefill_min_k: with native bf16 as well, from this K on (0: never). Where the GEMVs run two-group
        passes (wide.PAIR: AVX-512 VNNI) and bf16 has no AMX, the int8 GEMV beats oneDNN's bf16 GEMM (tiles
        dequantized per call) on Zen 4 at M = 512: Q5_0 4096x640 1.67x, Q4_K 640x1024 2.2x, Q8_0 256x640 1.35x,
        the 8B shapes 1.15-1.34x (M = 128: 1.3-2.2x), but not Q6_K at gemma's K = 2048 (0.85x): WIDE_PREFILL
        sets these. Otherwise Q4_K from K = 4096 (the 8B shapes: 1.2-1.6x at M = 128 before the pairs).
    """
    ggml_type: Q | RamlmType
    block_size: int
    type_size: int
    fields: tuple[str, ...]
    repack: Callable
    gemv: Callable
    dequant: Callable
    int8_activations: bool = True
    repack_copies: bool = True
    row_block: int = 1
    gemv_prefill: bool = False
    gemv_prefill_min_k: int = 0

    def row_bytes(self, K: int) -> int:
        return K // self.block_size * self.type_size


def _quant(t, fields, rp, gemv, deq, row_block=1, gemv_prefill=False, gemv_prefill_min_k=0,
           int8_activations=True) -> QuantFormat:
    bs, ts = QUANT_SIZES[t]
    return QuantFormat(t, bs, ts, fields, lambda raw, K: rp(raw), gemv, deq, row_block=row_block,
                       gemv_prefill=gemv_prefill, gemv_prefill_min_k=gemv_prefill_min_k,
                       int8_activations=int8_activations)


def _float(t, dtype, gemv, deq) -> QuantFormat:
    bs, ts = QUANT_SIZES[t]
    return QuantFormat(t, bs, ts, ("w",), partial(repack.float_rows, dtype=np.dtype(dtype)), gemv, deq,
                       int8_activations=False, repack_copies=False)


# The int8 GEMV beats the bf16 GEMM for long prompts too (gemv_prefill_min_k): AVX-512 VNNI, and no AMX tiles.
WIDE_PREFILL = PAIR and not AMX

FORMATS: dict[Q, QuantFormat] = {
    f.ggml_type: f for f in (
        _float(Q.F32, np.float32, k_float.gemv_f32, k_float.deq_f32),
        _float(Q.F16, np.uint16, k_float.gemv_f16, k_float.deq_f16),
        _float(Q.BF16, np.uint16, k_float.gemv_bf16, k_float.deq_bf16),
        _quant(Q.Q4_0, ("qs", "d"), repack.q4_0, k_bytes.gemv_q4_0, k_bytes.deq_q4_0, row_block=8,
               gemv_prefill=True, gemv_prefill_min_k=32 if WIDE_PREFILL else 0),
        _quant(Q.Q4_1, ("qs", "d", "m"), repack.q4_1, k_legacy.gemv_q4_1, k_legacy.deq_q4_1),
        _quant(Q.Q5_0, ("qs", "qh", "d"), repack.q5_0, k_bytes.gemv_q5_0, k_bytes.deq_q5_0, row_block=8,
               gemv_prefill=True, gemv_prefill_min_k=32 if WIDE_PREFILL else 0),
        _quant(Q.Q5_1, ("qs", "qh", "d", "m"), repack.q5_1, k_legacy.gemv_q5_1, k_legacy.deq_q5_1),
        _quant(Q.Q8_0, ("q", "d"), repack.q8_0, k_bytes.gemv_q8_0, k_bytes.deq_q8_0, row_block=8,
               gemv_prefill=True, gemv_prefill_min_k=32 if WIDE_PREFILL else 0),
        _quant(Q.Q2_K, ("qs", "sc", "d", "dmin"), repack.q2_k, k_lowbit.gemv_q2_k, k_lowbit.deq_q2_k),
        _quant(Q.Q3_K, ("hmask", "qs", "sc", "d"), repack.q3_k, k_lowbit.gemv_q3_k, k_lowbit.deq_q3_k),
        _quant(Q.Q4_K, ("qs", "sc", "mn", "d", "dmin"), repack.q4_k, k_kquants_x8.gemv_q4_k, k_kquants_x8.deq_q4_k,
               row_block=8, gemv_prefill=True, gemv_prefill_min_k=256 if WIDE_PREFILL else 0 if AMX else 4096),
        _quant(Q.Q5_K, ("qs", "qh", "sc", "mn", "d", "dmin"), repack.q5_k, k_kquants.gemv_q5_k,
               k_kquants.deq_q5_k),
        _quant(Q.Q6_K, ("ql", "qh", "sc", "d"), repack.q6_k, k_q6_k_x8.gemv_q6_k, k_q6_k_x8.deq_q6_k,
               row_block=8, gemv_prefill=True, gemv_prefill_min_k=4096 if WIDE_PREFILL else 0),
        # gpt-oss's experts: Q5_0's kernel shape over fewer bytes (17 per 32 values against 22), so Q5_0's routing
        # of long chunks (not measured on MXFP4 itself).
        _quant(Q.MXFP4, ("qs", "e"), repack.mxfp4, k_mxfp4.gemv_mxfp4, k_mxfp4.deq_mxfp4, row_block=8,
               gemv_prefill=True, gemv_prefill_min_k=32 if WIDE_PREFILL else 0),
        # llama.cpp's non-linear 4-bit formats: level bytes through Q8_0's dots, Q8_0's routing of long chunks.
        _quant(Q.IQ4_NL, ("qs", "d"), repack.iq4_nl, k_iq4.gemv_iq4_nl, k_iq4.deq_iq4_nl, row_block=8,
               gemv_prefill=True, gemv_prefill_min_k=32 if WIDE_PREFILL else 0),
        _quant(Q.IQ4_XS, ("qs", "sc", "d"), repack.iq4_xs, k_iq4.gemv_iq4_xs, k_iq4.deq_iq4_xs, row_block=8,
               gemv_prefill=True, gemv_prefill_min_k=32 if WIDE_PREFILL else 0),
        # llama.cpp's grid i-quants, ternary formats and NVFP4: the file's bytes, unpacked per 8-row group in each GEMV
        # (k_grid.py; the IQ2/IQ3 types two blocks a 512-bit vector on AVX-512 VNNI hosts, k_grid_pairs.py); long
        # chunks take the dense path.
        *(_quant(t, ("w",), repack.grid_rows, _grid_gemv(t), getattr(k_grid, "deq_" + t.name.lower()), row_block=8)
          for t in (Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.TQ1_0, Q.TQ2_0,
                    Q.NVFP4)),
        # HF FP8 checkpoints: float activations, so long prompts take the dense path (bf16 tiles where native).
        _quant(RamlmType.FP8_E4M3, ("q", "d", "f"), repack.fp8_e4m3, k_fp8.gemv_fp8, k_fp8.deq_fp8, row_block=8,
               int8_activations=False),
        # 8-bit weight-only HF checkpoints: Q8_0's GEMV (asymmetric: plus the zero points' share) over activations kept
        # to 16-bit precision (k_a16.py), Q8_0's routing of long chunks.
        _quant(RamlmType.U8_ZP, ("q", "d", "z"), repack.u8_zp, k_a16.gemv_u8zp_a16, k_zero_point.deq_u8zp,
               row_block=8, gemv_prefill=True, gemv_prefill_min_k=32 if WIDE_PREFILL else 0, int8_activations=False),
        _quant(RamlmType.Q8_A16, ("q", "d"), repack.q8_0, k_a16.gemv_q8_a16, k_bytes.deq_q8_0, row_block=8,
               gemv_prefill=True, gemv_prefill_min_k=32 if WIDE_PREFILL else 0, int8_activations=False),
    )
}


def get_format(ggml_type) -> QuantFormat:
    """FORMATS[ggml_type], with a clear error for formats ramlm cannot run."""
    try:
        return FORMATS[qtype(ggml_type)]
    except (KeyError, ValueError):
        name = getattr(ggml_type, "name", str(ggml_type))
        supported = ", ".join(t.name for t in FORMATS)
        raise NotImplementedError(f"weight format {name} is not supported (supported: {supported})") from None
