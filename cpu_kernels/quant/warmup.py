"""Compile (or load from Numba's cache) every kernel signature the engine uses, on tiny shapes."""
from __future__ import annotations

import time

import numpy as np


def native_bf16() -> bool:
    """Whether the CPU multiplies bf16 natively (then long prompts dequantize tiles to bf16 bits), judged from its
    feature flags: asking torch, as linear.auto_dense_dtype does, would import it."""
    from .simd import HOST_FEATURES
    return "avx512bf16" in HOST_FEATURES or "amx-bf16" in HOST_FEATURES


def warmup(verbose: bool = False, types=None, bf16=None) -> float:
    """Run each format's repack, gemv and dequantize once with the dtypes and layouts QuantLinear passes.

    types: the ggml types to warm (default: every registered format).
    bf16: also dequantize to bf16 bits, as the bfloat16 prefill path does (default: where it is native).
    Returns the seconds it took (first process: compiles; later ones: cache loads)."""
    from .linear import QuantLinear
    from .quantize import UNWRITTEN, quantize
    from .registry import FORMATS

    bf16 = native_bf16() if bf16 is None else bf16

    t0 = time.perf_counter()
    for t, fmt in FORMATS.items():
        if types is not None and t not in types:
            continue
        t1 = time.perf_counter()
        K = max(fmt.block_size, 32)
        if t in UNWRITTEN:  # zero bytes are a valid block of every format (scale 0)
            raw = np.zeros((2, fmt.row_bytes(K)), np.uint8)
        else:
            raw = quantize(t, np.linspace(-1, 1, 2 * K, dtype=np.float32).reshape(2, K))
        raw.flags.writeable = False  # as a model file's memory map: the repackers' signature says read-only
        lin = QuantLinear.from_raw(t, raw, (2, K))
        lin.matmul(np.ones((1, K), np.float32))
        lin.embed(np.zeros(1, np.int64))
        if bf16:
            lin.fmt.dequant(*lin.packed, np.zeros(1, np.int64), np.empty((1, K), np.uint16))
        if verbose:
            print(f"warmup {t.name}: {time.perf_counter() - t1:.2f} s")
    if bf16:  # the bf16 GEMM's input rounding and output widening (QuantLinear._matmul_dense)
        from . import bf16_io
        x = np.ones((2, 32), np.float32)
        bf16_io.from_bf16(bf16_io.to_bf16(x), x, 0, 0, np.zeros(32, np.float32))
    return time.perf_counter() - t0
