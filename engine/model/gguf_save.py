"""Save a model quantized at load (vLLM's `quantization` argument) as a GGUF file: llama-quantize's job, with the
project's quantizers (online_quant.py).

The source is a GGUF file (F32/F16/BF16 tensors are quantized, others kept): its metadata, the tokenizer's included,
is copied key by key with its GGUF value types, general.file_type is set to the method's llama.cpp file type, and the
tensors are written one at a time (the float source pages are released as each is done). HF folders are refused:
their tokenizer has no GGUF form here (llama.cpp's convert_hf_to_gguf.py writes one).
"""
from __future__ import annotations

import gguf
import numpy as np

from engine.errors import ModelLoadError
from engine.model.online_quant import METHODS, QuantizedWeights
from engine.model.weights import open_weights

Q = gguf.GGMLQuantizationType
# llama_ftype of each method's main type (MOSTLY_Q8_0, MOSTLY_Q4_K_M's neighbour MOSTLY_Q4_K_S, MOSTLY_Q4_0).
FILE_TYPES = {"q8_0": 7, "int8": 7, "q4_k": 14, "int4": 2}
_SKIP_KEYS = ("GGUF.", "general.file_type", "general.architecture")


def _copy_metadata(reader: gguf.GGUFReader, w: gguf.GGUFWriter) -> None:
    for key, field in reader.fields.items():
        if key.startswith(_SKIP_KEYS):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        w.add_key_value(key, field.contents(), vtype, sub)


def save_quantized_gguf(src: str, out: str, method: str) -> dict:
    """Quantize src's float tensors by `method` (online_quant.METHODS but fp8) into a GGUF file at out; returns
    {tensor type name: count}."""
    if method not in METHODS:
        raise ValueError(f"quantization {method!r} is not supported (supported: {', '.join(METHODS)})")
    if method not in FILE_TYPES:
        raise ValueError(f"quantization {method!r} makes ramlm's own {METHODS[method].name} rows, which GGUF files "
                         f"cannot hold; save one of: {', '.join(FILE_TYPES)}")
    ws = open_weights(src)
    if ws.format != "gguf":
        raise ModelLoadError(f"{src}: saving as GGUF needs a GGUF source (its tokenizer metadata is copied); convert "
                             "the HF folder with llama.cpp's convert_hf_to_gguf.py --outtype bf16 first, or load it "
                             f"with quantization={method!r} directly")
    qw = QuantizedWeights(ws, method)
    reader = gguf.GGUFReader(ws.path)
    w = gguf.GGUFWriter(out, reader.fields["general.architecture"].contents())
    _copy_metadata(reader, w)
    w.add_file_type(FILE_TYPES[method])
    counts: dict[str, int] = {}
    for name in qw.names():
        info = qw.info(name)
        t = info.ggml_type
        if t in (Q.F32, Q.F16, Q.BF16):
            dtype = {Q.F32: np.float32, Q.F16: np.float16, Q.BF16: np.uint16}[t]
            w.add_tensor_info(name, info.shape, np.dtype(dtype), info.nbytes, raw_dtype=t if t == Q.BF16 else None)
        else:
            block, size = gguf.GGML_QUANT_SIZES[t]
            row_bytes = info.shape[-1] // block * size
            w.add_tensor_info(name, (*info.shape[:-1], row_bytes), np.dtype(np.uint8), info.nbytes, raw_dtype=t)
        counts[t.name] = counts.get(t.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name in qw.names():
        w.write_tensor_data(np.ascontiguousarray(qw.raw(name)))
    w.close()
    return counts
