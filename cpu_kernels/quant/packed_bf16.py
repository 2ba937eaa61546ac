"""An F32 weight's bf16 copy in oneDNN's blocked layout, for the bf16 prefill GEMM: made at the first long prefill
and kept (half the f32 bytes more), so neither the f32 -> bf16 rounding of W nor oneDNN's reordering of it is paid
again on every call. The products are torch.mm's bits on the same bf16 W (tests check it), and a row's bits do not
depend on how many rows share the call."""
from __future__ import annotations

import numpy as np

from gguf import GGMLQuantizationType as Q

from . import bf16_io

PACK_M = 4096  # the rows oneDNN picks the weight's layout for (a long prefill step's)
OUT_ELEMS = 8 << 20  # products per call: 16 MB of bf16 stays in glibc's heap, not a fresh mapping per call


def packed_weight(lin):
    """lin's W as oneDNN's packed bf16 tensor (made once, kept on lin), or None: not an F32 weight, or this torch
    has no packed linear."""
    if lin.ggml_type != Q.F32:
        return None
    got = getattr(lin, "_bf16_packed", None)
    if got is None:
        import torch
        try:
            w = np.empty((lin.N, lin.K), np.uint16)
            lin.fmt.dequant(*lin.packed, np.arange(lin.N, dtype=np.int64), w)
            got = torch.ops.mkldnn._reorder_linear_weight(torch.from_numpy(w).view(torch.bfloat16), PACK_M)
        except (AttributeError, RuntimeError):  # a torch without oneDNN's packed linear: the per-call path
            got = False
        lin._bf16_packed = got
    return got if got is not False else None


def matmul_into(wp, xt, runs, y: np.ndarray, bias: np.ndarray | None) -> None:
    """y[a:b] = float32(bf16(xt[a:b] @ W^T)) (+ bias) for each (a, b) in runs; xt bf16 (M, K), wp packed_weight's."""
    import torch

    step = max(1, OUT_ELEMS // y.shape[1])
    for a, b in runs:
        for r0 in range(a, b, step):
            r1 = min(b, r0 + step)
            prod = torch.ops.mkldnn._linear_pointwise(xt[r0:r1], wp, None, "none", [], "")
            bf16_io.from_bf16(prod.view(torch.int16).numpy().view(np.uint16), y, r0, 0, bias)
