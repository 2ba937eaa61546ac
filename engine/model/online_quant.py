"""vLLM's `quantization` argument: float weights (HF folders in f32/f16/bf16, GGUF F32/F16/BF16 tensors) quantized
as they load, so a bf16 checkpoint runs in about half its memory.

- "fp8": the linear layers' weights (blk.*) become FP8_E4M3 (a scale per 128 values of a row), as vLLM's online
  fp8 keeps embeddings and lm_head in float; an FP8 checkpoint already is fp8 (nothing to do).
- "q8_0": every weight matrix llama.cpp's quantizer would quantize (embeddings and the output matrix too) becomes
  GGUF Q8_0, bit for bit what llama.cpp's reference quantizer writes.
- "q4_k": the same matrices as GGUF Q4_K (Q5_0 where rows are not whole 256-value blocks, as llama.cpp falls back),
  by ramlm's min-max Q4_K quantizer (no llama.cpp-style scale search: somewhat larger error than its Q4_K_M).
- "int8" / "int4": the linear layers' weights, symmetric round-to-nearest as llm-compressor's W8A16 (one scale per
  output row) and W4A16 (one per 128 input values) schemes make them, held as the Q8_0 / Q4_0 blocks of those
  numbers (hf_int.int_blocks; fp16 scales).
Tensors that stay float in GGUF files (norms, routers, biases, conv kernels, sinks, 1-D vectors) stay as they are,
and so do tensors already quantized or whose rows are not whole blocks.
"""
from __future__ import annotations

import re

import numpy as np
from gguf import GGMLQuantizationType as Q

from cpu_kernels.quant.qtypes import QUANT_SIZES, RamlmType
from engine.model.gguf import TensorInfo, tensor_nbytes
from engine.model.weights import WeightSource

METHODS = {"fp8": RamlmType.FP8_E4M3, "q8_0": Q.Q8_0, "q4_k": Q.Q4_K, "int8": Q.Q8_0, "int4": Q.Q4_0}
LINEAR_ONLY = ("fp8", "int8", "int4")  # vLLM's and llm-compressor's schemes keep embeddings and lm_head in float
INT_GROUP = {"int8": -1, "int4": 128}  # values per scale along a row (-1: the whole row)
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
# GGUF names llama.cpp's quantizer keeps in float (its llama_tensor_get_type rules for the families ramlm runs)
_KEEP_FLOAT = re.compile(r"norm|ffn_gate_inp|\.bias$|ssm_conv1d|attn_sinks|exp_probs_b|ssm_a$|ssm_dt|"
                         r"rope_freqs|altup|laurel|\.scale$")


def quantizable(name: str, info: TensorInfo, method: str) -> bool:
    if info.ggml_type not in FLOAT_TYPES or len(info.shape) not in (2, 3) or _KEEP_FLOAT.search(name):
        return False
    if method in LINEAR_ONLY and not name.startswith("blk."):
        return False
    return target_type(method, info.shape) is not None


def target_type(method: str, shape: tuple[int, ...]):
    """The type `method` gives a matrix of this shape (llama.cpp's fallback where rows are not whole blocks), or
    None where no block type fits."""
    t = METHODS[method]
    if method in INT_GROUP and INT_GROUP[method] > 0 and shape[-1] % INT_GROUP[method]:
        return None
    if t == Q.Q4_K:
        from offload.meta import fit_rows
        t = fit_rows(t, tuple(shape))
    return t if t not in FLOAT_TYPES and shape[-1] % QUANT_SIZES[t][0] == 0 else None


class QuantizedWeights(WeightSource):
    """A WeightSource whose float weight matrices are handed out quantized (module docstring)."""

    def __init__(self, ws: WeightSource, method: str):
        if method not in METHODS:
            raise ValueError(f"quantization {method!r} is not supported (supported: {', '.join(METHODS)})")
        self._ws, self.method = ws, method
        self.config, self.path, self.format, self.metadata = ws.config, ws.path, ws.format, ws.metadata
        self._targets = {n for n in ws.names() if quantizable(n, ws.info(n), method)}

    def names(self) -> list[str]:
        return self._ws.names()

    def __contains__(self, name: str) -> bool:
        return name in self._ws

    def info(self, name: str) -> TensorInfo:
        info = self._ws.info(name)
        if name not in self._targets:
            return info
        t = target_type(self.method, info.shape)
        return TensorInfo(name, t, info.shape, -1, tensor_nbytes(t, info.shape))

    def raw(self, name: str) -> np.ndarray:
        a = self._ws.raw(name)
        if name not in self._targets:
            return a
        from cpu_kernels.quant.quantize import quantize
        info = self._ws.info(name)
        w = (a.astype(np.uint32) << 16).view(np.float32) if info.ggml_type == Q.BF16 else a.astype(np.float32)
        w = w.reshape(-1, info.shape[-1])
        rows = int_rtn(w, self.method) if self.method in INT_GROUP else quantize(target_type(self.method, info.shape), w)
        self._ws.release(name)  # the float bytes are done with
        return rows.reshape(*info.shape[:-1], rows.shape[-1])

    def release(self, name: str, lo: int = 0, hi: int | None = None) -> None:
        if name not in self._targets:
            self._ws.release(name, lo, hi)


def quantize_at_load(ws: WeightSource, method: str | None) -> WeightSource:
    """ws itself (method None, or an FP8 checkpoint asked for fp8), or ws quantized by `method`. A checkpoint that
    is already quantized some other way is refused, as vLLM refuses a quantization that differs from the config's."""
    if method is None:
        return ws
    from engine.model import hf_quant
    scheme = hf_quant.parse(ws.metadata) if ws.format == "hf" else None
    qc = ws.metadata.get("quantization_config") if ws.format == "hf" else None
    if scheme is not None or qc:
        if method == "fp8" and scheme is not None:
            return ws
        have = qc.get("quant_method") if isinstance(qc, dict) else qc
        raise ValueError(f"{ws.path} is already quantized (quant_method {have!r}); quantization={method!r} does "
                         "not apply to it")
    return QuantizedWeights(ws, method)


def int_rtn(w: np.ndarray, method: str) -> np.ndarray:
    """w f32 (N, K) -> the Q8_0 / Q4_0 rows of its symmetric round-to-nearest int8 (per row) or int4 (per 128)."""
    from cpu_kernels.quant.quantize_fast import int_rtn_rows
    N, K = w.shape
    return int_rtn_rows(w, 8 if method == "int8" else 4, K if INT_GROUP[method] == -1 else INT_GROUP[method])


def int_rtn_numpy(w: np.ndarray, method: str) -> np.ndarray:
    """int_rtn in numpy through hf_int.int_blocks (the reference the Numba quantizer is tested against)."""
    from engine.model.hf_int import int_blocks
    bits = 8 if method == "int8" else 4
    top = (1 << (bits - 1)) - 1
    N, K = w.shape
    group = K if INT_GROUP[method] == -1 else INT_GROUP[method]
    g = w.reshape(N, K // group, group)
    amax = np.abs(g).max(axis=-1)
    scale = np.where(amax > 0, amax / top, 1.0).astype(np.float16)  # stored fp16: the values use it as stored
    s32 = scale.astype(np.float32)[..., None]
    v = np.clip(np.rint(g / s32), -top - 1, top).astype(np.int32).reshape(N, K // 32, 32)
    d = np.repeat(scale, group // 32, axis=1)
    return int_blocks(v, d, METHODS[method], f"quantization={method}")
