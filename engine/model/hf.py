"""HF model folders: *.safetensors -> GGUF-named, GGUF-convention tensors (config.json -> ModelConfig: hf_config.py).

Safetensors headers are parsed here (8-byte length + JSON) and tensors are views of a read-only memory map,
so F32/F16/BF16 are all zero-copy (BF16 as its uint16 bits). Only tensors that llama.cpp's converter changes
are computed, on every raw() call: llama/mistral attn_q/attn_k (bias too) rows permuted like
convert_hf_to_gguf.py's LlamaModel.permute (Architecture.hf_permute_qk), norm weights + 1.0 where the
architecture stores them zero-centred (hf_norm_offset; F32, as GGUF has them), and experts stacked into (E, N, K).
"""
from __future__ import annotations

import json
import logging
import math
import mmap
import os
import re
import struct
from dataclasses import replace
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as GT

from cpu_kernels.quant.qtypes import QUANT_SIZES, dequantize
from engine.errors import ModelLoadError
from engine.model import hf_fp8, hf_int, hf_quant
from engine.model.config import ModelConfig
from engine.model.hf_config import config_from_hf
from engine.model.gguf import TensorInfo, raw_view, tensor_nbytes
from engine.model.registry import architecture
from engine.model.weights import WeightSource

logger = logging.getLogger("ramlm.model")
_ST_DTYPES = {"F32": GT.F32, "F16": GT.F16, "BF16": GT.BF16}
_ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
_MAX_ST_HEADER = 100 << 20

# Per-layer HF suffix -> GGUF tensor (the .weight/.bias ending is carried over); architectures add their own.
LAYER_MAP = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp", "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    # an MTP layer's own tensors (DeepSeek-V3's names, which GLM-4.5 and Qwen3.5's renamed mtp.* share)
    "eh_proj": "nextn.eh_proj", "enorm": "nextn.enorm", "hnorm": "nextn.hnorm",
    "shared_head.norm": "nextn.shared_head_norm", "shared_head.head": "nextn.shared_head_head",
    "embed_tokens": "nextn.embed_tokens",
}
# Per-layer HF tensors whose names end otherwise (DeepSeek's routing bias, gpt-oss's sinks), mapped whole; an
# architecture adds its own (Architecture.hf_special_map).
SPECIAL_MAP = {"mlp.gate.e_score_correction_bias": "exp_probs_b.bias", "self_attn.sinks": "attn_sinks.weight"}
_SPECIAL_RE = re.compile(r"model\.layers\.(\d+)\.(.+)$")
LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_EXPERT_RE = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_FUSED_EXPERT_RE = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up|down)_proj$")
PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
             ("language_model.lm_head.", "lm_head."))
# A bare base model's names (Qwen3Model, Gemma3TextModel: how Qwen3-Embedding and EmbeddingGemma ship)
BARE = ("embed_tokens.", "layers.", "norm.")


def _fail(source: str, reason: str):
    raise ModelLoadError(f"{source}: {reason}")


# ----------------------------------------------------------------------------------------- safetensors

class _SafetensorsFile:
    """Header of one .safetensors file and a read-only map of it; entries: name -> (dtype, shape, offset, nbytes)."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 8:
                    _fail(path, f"not a safetensors file: {size} bytes")
                n = struct.unpack("<Q", f.read(8))[0]
                if n > min(size - 8, _MAX_ST_HEADER):
                    _fail(path, f"corrupt safetensors header length {n} (file has {size} bytes)")
                header = f.read(n)
                self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + n else b""
        except OSError as e:
            raise ModelLoadError(f"{path}: cannot read: {e}") from e
        try:
            meta = json.loads(header)
            assert isinstance(meta, dict)
        except (ValueError, AssertionError):
            _fail(path, "corrupt safetensors header (not a JSON object)")
        start = 8 + n
        self.entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, e in meta.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (b, end) = e["dtype"], tuple(int(d) for d in e["shape"]), e["data_offsets"]
                b, end = int(b), int(end)
            except (KeyError, TypeError, ValueError):
                _fail(path, f"tensor '{name}': malformed header entry {e!r}")
            if dtype not in _ST_ITEMSIZE:
                _fail(path, f"tensor '{name}': unknown dtype {dtype}")
            if any(d < 0 for d in shape) or not 0 <= b <= end or start + end > size:
                _fail(path, f"tensor '{name}': data [{b}, {end}) shape {shape} lies outside the file")
            if end - b != math.prod(shape) * _ST_ITEMSIZE[dtype]:
                _fail(path, f"tensor '{name}': {end - b} bytes do not match {dtype} {shape}")
            self.entries[name] = (dtype, shape, start + b, end - b)


def _safetensors_files(folder: str) -> list[str]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"{index}: unreadable index ({e})") from e
        for fn in files:
            if not os.path.isfile(os.path.join(folder, fn)):
                _fail(index, f"lists '{fn}', which is not in the folder")
        return [os.path.join(folder, fn) for fn in files]
    if os.path.isfile(os.path.join(folder, "model.safetensors")):
        return [os.path.join(folder, "model.safetensors")]
    files = sorted(fn for fn in os.listdir(folder)
                   if fn.endswith(".safetensors") and not fn.startswith("consolidated"))
    if not files:
        _fail(folder, "no *.safetensors files (pytorch_model.bin checkpoints are not supported)")
    return [os.path.join(folder, fn) for fn in files]


# ----------------------------------------------------------------------------------------- the source

class HFWeights(WeightSource):
    """An HF folder seen through GGUF names and conventions (module docstring says which tensors are copies)."""
    format = "hf"

    def __init__(self, folder: str):
        self.path = folder
        cfg_path = os.path.join(folder, "config.json")
        try:
            with open(cfg_path) as f:
                self.metadata = json.load(f)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{cfg_path}: unreadable ({e})") from e
        if not isinstance(self.metadata, dict):
            _fail(cfg_path, "not a JSON object")
        config = config_from_hf(self.metadata, cfg_path)
        self.arch = architecture(config.arch)
        self.quant = hf_quant.parse(self.metadata, cfg_path)  # FP8 scheme, or None
        self._files = [_SafetensorsFile(p) for p in _safetensors_files(folder)]
        self.file_of = {key: f for f in self._files for key in f.entries}  # scale tensors are found by key
        self._sources: dict[str, list[tuple[_SafetensorsFile, str]]] = {}  # GGUF name -> the HF tensors it reads
        self._tensors: dict[str, tuple[TensorInfo, Callable[[], np.ndarray]]] = {}
        self.unmapped: list[str] = []  # HF tensors with no GGUF counterpart (vision tower, inv_freq, ...)
        self._in_perms: dict[str, np.ndarray] = {}  # act-order weights: GGUF name -> the stored input order
        self._perm_asked: set[str] = set()
        self._map(config)
        self.config = self._reconcile(config)
        self._log_skipped()

    # -- names -----------------------------------------------------------------------------------------
    def _map(self, c: ModelConfig) -> None:
        sources: dict[str, tuple[_SafetensorsFile, str]] = {}
        for f in self._files:
            for name in f.entries:
                hf = name
                for old, new in PREFIXES:
                    if hf.startswith(old):
                        hf = new + hf[len(old):]
                if hf.startswith(BARE):
                    hf = "model." + hf
                hf = self.arch.hf_rename(hf, c)
                if isinstance(self.quant, hf_quant.IntScheme) and hf.endswith((".qweight", ".weight_packed")):
                    hf = hf.rsplit(".", 1)[0] + ".weight"  # a packed module's weight (_int_entry reads the rest)
                if hf in sources:
                    _fail(f.path, f"tensor '{name}' also appears in {sources[hf][0].path}")
                sources[hf] = (f, name)
        layer_map = {**LAYER_MAP, **self.arch.hf_layer_map}
        special = {**SPECIAL_MAP, **self.arch.hf_special_map}
        experts: dict[tuple[int, str], dict[int, tuple[_SafetensorsFile, str]]] = {}
        for hf, src in sources.items():
            if self.arch.hf_tensor(self, hf, src, sources):  # the architecture's own layout (gpt-oss's experts)
                continue
            if hf == "model.embed_tokens.weight":
                self._add("token_embd.weight", c, src)
            elif hf == "model.norm.weight":
                self._add("output_norm.weight", c, src)
            elif hf == "lm_head.weight":
                self._add("output.weight", c, src)
            elif hf == "score.weight":  # a *ForSequenceClassification head (llama.cpp's cls.output)
                self._add("cls.output.weight", c, src)
            elif hf in self.arch.hf_model_map:
                self._add(self.arch.hf_model_map[hf], c, src)
            elif m := _EXPERT_RE.match(hf):
                experts.setdefault((int(m[1]), m[3]), {})[int(m[2])] = src
            elif m := _FUSED_EXPERT_RE.match(hf):
                self._add_fused_experts(int(m[1]), m[2], src)
            elif (m := LAYER_RE.match(hf)) and (parts := self.arch.hf_split(c, f"{m[2]}.{m[3]}")):
                self._add_split(int(m[1]), parts, src)
            elif (m := LAYER_RE.match(hf)) and m[2] in layer_map:
                self._add(f"blk.{m[1]}.{layer_map[m[2]]}.{m[3]}", c, src)
            elif (m := _SPECIAL_RE.match(hf)) and m[2] in special:
                self._add(f"blk.{m[1]}.{special[m[2]]}", c, src)
            elif self.quant is not None and hf.rsplit(".", 1)[-1] in self._aux_suffixes():
                continue  # a scale (zero points, g_idx): read with its weight (_entry)
            else:
                self.unmapped.append(src[1])
        for (layer, proj), by_expert in sorted(experts.items()):
            self._add_stacked(f"blk.{layer}.ffn_{proj}_exps.weight", by_expert)
        if self.unmapped:
            groups = sorted({".".join(n.split(".")[:2]) for n in self.unmapped})
            logger.info("%s: the text model skips %d tensors (%s)", self.path, len(self.unmapped), ", ".join(groups))

    def _entry(self, src: tuple[_SafetensorsFile, str], gguf_name: str) -> tuple[GT, tuple[int, ...], Callable]:
        f, key = src
        dtype, shape, offset, nbytes = f.entries[key]
        if dtype == "F8_E4M3":
            return hf_fp8.entry(self, src, gguf_name)
        if isinstance(self.quant, hf_quant.IntScheme) and (
                (dtype == "I32" and key.endswith((".qweight", ".weight_packed"))) or dtype == "I8"):
            return hf_int.entry(self, src, gguf_name)
        if dtype not in _ST_DTYPES:
            _fail(f.path, f"tensor '{key}' ({gguf_name}): dtype {dtype} is not supported (F32, F16, BF16)")
        if not shape or 0 in shape:
            _fail(f.path, f"tensor '{key}' ({gguf_name}): shape {shape} is not usable")
        info = TensorInfo(gguf_name, _ST_DTYPES[dtype], shape, offset, nbytes)
        return info.ggml_type, shape, lambda: raw_view(f.mm, info)

    def _perm(self, src: tuple[_SafetensorsFile, str]) -> np.ndarray | None:
        """The input order of an act-order int weight (hf_int.input_perm); None for every other tensor."""
        f, key = src
        if isinstance(self.quant, hf_quant.IntScheme) and key.endswith((".qweight", ".weight_packed")):
            return hf_int.input_perm(self, src)
        return None

    def _aux_suffixes(self) -> tuple[str, ...]:
        if isinstance(self.quant, hf_quant.IntScheme):
            return hf_quant.CT_INT_SUFFIXES if self.quant.method.startswith("ct-") else hf_quant.GPTQ_SUFFIXES[1:]
        return hf_quant.AUX_SUFFIXES

    def _add(self, name: str, c: ModelConfig, src: tuple[_SafetensorsFile, str]) -> None:
        gtype, shape, load = self._entry(src, name)
        perm = self._perm(src)
        base = name.split(".")[-2]
        offset = src[0].entries[src[1]][2] if gtype in _ST_DTYPES.values() else -1  # FP8 rows are computed
        if self.arch.hf_permute_qk and base in ("attn_q", "attn_k"):
            n_head = c.num_heads if base == "attn_q" else c.num_kv_heads
            if shape[0] % (2 * n_head):
                _fail(src[0].path, f"tensor '{src[1]}': {shape[0]} rows do not split into {n_head} heads")
            load, offset = (lambda ld=load: permute_qk(ld(), n_head)), -1
        if self.arch.hf_norm_offset and base.endswith("norm") and base not in self.arch.hf_plain_norms:
            off = np.float32(self.arch.hf_norm_offset)
            load, offset, gtype = (lambda ld=load, t=gtype: _as_f32(ld(), t) + off), -1, GT.F32
        transform = self.arch.hf_transform(name, shape, c)
        rows_fn = self.arch.hf_transform_rows(name, shape, c, QUANT_SIZES[gtype][0]) \
            if transform is not None and gtype not in _ST_DTYPES.values() and transform[0] == shape else None
        if rows_fn is not None:  # moves of whole rows or blocks: the weight stays quantized
            load, offset = (lambda ld=load, fn=rows_fn: np.ascontiguousarray(fn(ld()))), -1
        elif transform is not None:
            shape, fn = transform
            load, offset, gtype = (lambda ld=load, t=gtype, fn=fn, p=perm: fn(_in_order(_as_f32(ld(), t), p))), -1, \
                GT.F32
            perm = None
        if perm is not None:
            self._in_perms[name] = perm
        self._tensors[name] = (TensorInfo(name, gtype, shape, offset, tensor_nbytes(gtype, shape)), load)
        self._sources[name] = [src]

    def _add_split(self, layer: int, parts: dict, src: tuple[_SafetensorsFile, str]) -> None:
        # Architecture.hf_split: GGUF tensors computed from one HF tensor (data movement only: any dtype).
        gtype, shape, load = self._entry(src, f"blk.{layer}")
        if sum(math.prod(sub) for sub, _ in parts.values()) != math.prod(shape):
            _fail(src[0].path, f"tensor '{src[1]}': shape {shape} does not split into "
                               f"{', '.join(f'{rel} {sub}' for rel, (sub, _) in parts.items())}")
        if gtype not in _ST_DTYPES.values():  # a quantized weight: the split cuts across blocks, so its float values
            load, gtype = (lambda ld=load, t=gtype, p=self._perm(src): _in_order(_as_f32(ld(), t), p)), GT.F32
        for rel, (sub, fn) in parts.items():
            name = f"blk.{layer}.{rel}"
            self._tensors[name] = (TensorInfo(name, gtype, sub, -1, tensor_nbytes(gtype, sub)),
                                   lambda ld=load, fn=fn: np.ascontiguousarray(fn(ld())))
            self._sources[name] = [src]

    def _add_stacked(self, name: str, by_expert: dict[int, tuple[_SafetensorsFile, str]]) -> None:
        if sorted(by_expert) != list(range(len(by_expert))):
            _fail(self.path, f"tensor '{name}': experts {sorted(by_expert)} are not 0..E-1")
        parts = [self._entry(by_expert[e], name) for e in range(len(by_expert))]
        if len({(t, s) for t, s, _ in parts}) != 1:
            _fail(self.path, f"tensor '{name}': experts differ in dtype or shape")
        gtype, shape = parts[0][0], (len(parts), *parts[0][1])
        perms = [self._perm(by_expert[e]) for e in range(len(by_expert))]
        if any(p is not None for p in perms):  # act-order experts: each its own input order, (E, K)
            self._in_perms[name] = np.stack([np.arange(shape[-1]) if p is None else p for p in perms])
        loads = [ld for _, _, ld in parts]
        self._tensors[name] = (TensorInfo(name, gtype, shape, -1, tensor_nbytes(gtype, shape)),
                               lambda: np.stack([ld() for ld in loads]))
        self._sources[name] = [by_expert[e] for e in range(len(by_expert))]

    def _add_fused_experts(self, layer: int, which: str, src: tuple[_SafetensorsFile, str]) -> None:
        # transformers 5 in-memory layout: gate_up_proj (E, 2I, H) = [gate; up] on dim 1, down_proj (E, H, I).
        gtype, shape, load = self._entry(src, f"blk.{layer}.ffn_{which}_exps.weight")
        if len(shape) != 3 or (which == "gate_up" and shape[1] % 2):
            _fail(src[0].path, f"tensor '{src[1]}': shape {shape} is not (E, N, K)")
        if which == "down":
            name = f"blk.{layer}.ffn_down_exps.weight"
            offset = src[0].entries[src[1]][2] if gtype in _ST_DTYPES.values() else -1
            self._tensors[name] = (TensorInfo(name, gtype, shape, offset, tensor_nbytes(gtype, shape)), load)
            self._sources[name] = [src]
            return
        half = shape[1] // 2
        for i, proj in enumerate(("gate", "up")):
            name, sub = f"blk.{layer}.ffn_{proj}_exps.weight", (shape[0], half, shape[2])
            self._tensors[name] = (TensorInfo(name, gtype, sub, -1, tensor_nbytes(gtype, sub)),
                                   lambda ld=load, i=i: np.ascontiguousarray(ld()[:, i * half:(i + 1) * half]))
            self._sources[name] = [src]

    def _reconcile(self, c: ModelConfig) -> ModelConfig:
        """Make config and tensors agree: tied <=> no output.weight (the GGUF rule); vocab = logits rows; the MTP
        layers are those the folder holds after the main ones (config.json may count some it does not hold)."""
        if "token_embd.weight" not in self._tensors:
            _fail(self.path, "missing required tensor 'model.embed_tokens.weight'")
        extra = {int(n.split(".")[1]) for n in self._tensors if n.startswith("blk.")} - set(range(c.num_layers))
        c = replace(c, nextn_layers=len(extra))
        if c.tie_word_embeddings or "output.weight" not in self._tensors:
            self._tensors.pop("output.weight", None)
            c = replace(c, tie_word_embeddings=True)
        head = self._tensors.get("output.weight", self._tensors["token_embd.weight"])[0]
        eos = list(c.eos_token_ids)
        gen = os.path.join(self.path, "generation_config.json")
        if os.path.isfile(gen):
            try:
                with open(gen) as f:
                    g = json.load(f).get("eos_token_id")
                eos += [i for i in (g if isinstance(g, list) else [g]) if isinstance(i, int) and i not in eos]
            except (OSError, ValueError, AttributeError):
                pass  # generation_config is advisory
        return replace(c, vocab_size=head.shape[0], eos_token_ids=tuple(eos),
                       name=c.name or os.path.basename(os.path.normpath(self.path)))

    def _log_skipped(self) -> None:
        """A multimodal checkpoint: say which towers are left out (only its text model runs)."""
        towers = [k.removesuffix("_config") for k in ("vision_config", "audio_config") if self.metadata.get(k)]
        if not isinstance(self.metadata.get("text_config"), dict) or not towers and not self.unmapped:
            return
        logger.info("%s: loading the text model of this %s checkpoint; skipping its %s (%d tensors not loaded)",
                    self.path, self.metadata.get("model_type", "multimodal"),
                    " and ".join(towers) or "non-text parts", len(self.unmapped))

    # -- for Architecture.hf_tensor ------------------------------------------------------------------------
    def source_array(self, src: tuple[_SafetensorsFile, str]) -> tuple[str, np.ndarray]:
        """(safetensors dtype, a read-only view of the tensor with its shape: F32/F16, BF16 as uint16 bits, U8)."""
        f, key = src
        dtype, shape, offset, nbytes = f.entries[key]
        np_dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U8": np.uint8,
                    "F8_E4M3": np.uint8, "I32": np.int32, "I8": np.int8}.get(dtype)
        if np_dtype is None:
            _fail(f.path, f"tensor '{key}': dtype {dtype} is not supported (F32, F16, BF16, U8, I8, I32, F8_E4M3 as bytes)")
        return dtype, np.frombuffer(f.mm, np_dtype, count=nbytes // _ST_ITEMSIZE[dtype], offset=offset).reshape(shape)

    def float_array(self, src: tuple[_SafetensorsFile, str]) -> np.ndarray:
        """source_array with F16/BF16 widened to float32 (exact); other dtypes as they are."""
        dtype, a = self.source_array(src)
        return _as_f32(a, _ST_DTYPES[dtype]) if dtype in _ST_DTYPES else a

    def add_tensor(self, name: str, gtype: GT, shape: tuple[int, ...], load: Callable[[], np.ndarray]) -> None:
        """A GGUF-named tensor computed by load() (GGUFFile.raw's form: typed for float types, uint8 (..., row
        bytes) for block formats)."""
        self._tensors[name] = (TensorInfo(name, gtype, shape, -1, tensor_nbytes(gtype, shape)), load)

    def float_type(self, dtype: str, what: str) -> GT:
        """The GGML type of a safetensors float dtype, or ModelLoadError naming `what`."""
        if dtype not in _ST_DTYPES:
            _fail(self.path, f"{what}: dtype {dtype} is not supported (F32, F16, BF16)")
        return _ST_DTYPES[dtype]

    def fail(self, reason: str):
        _fail(self.path, reason)

    # -- WeightSource ----------------------------------------------------------------------------------
    def release(self, name: str, lo: int = 0, hi: int | None = None) -> None:
        """Drop the mapped pages of the HF tensors `name` was read from, once all of it is done (a partial range:
        nothing, its bytes need not follow the source's); whole pages only, advice only."""
        if name not in self._sources or (hi is not None and hi < self.info(name).nbytes) or not hasattr(
                mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        for f, key in self._sources[name]:
            _, _, offset, nbytes = f.entries[key]
            start, end = -(-offset // page) * page, (offset + nbytes) // page * page
            if end > start and hasattr(f.mm, "madvise"):
                try:
                    f.mm.madvise(mmap.MADV_DONTNEED, start, end - start)
                except OSError:
                    pass

    def names(self) -> list[str]:
        return list(self._tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self._tensors[name][0]
        except KeyError:
            raise ModelLoadError(f"{self.path}: tensor '{name}': not in the model") from None

    def in_perm(self, name: str) -> np.ndarray | None:
        self._perm_asked.add(name)
        return self._in_perms.get(name)

    def raw(self, name: str) -> np.ndarray:
        """Zero-copy view for plain tensors; a fresh array for permuted / +1 / stacked ones."""
        self.info(name)
        if name in self._in_perms and name not in self._perm_asked:  # its reader would get the inputs out of order
            _fail(self.path, f"tensor '{name}': act-order (desc_act) weights are not supported where this model "
                             "reads it")
        return self._tensors[name][1]()


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp converter's LlamaModel.permute: rows (n_head, 2, D/2) -> (n_head, D/2, 2).

    HF llama pairs rotary dims (i, i + D/2); after this, pairs are (2i, 2i + 1) -- "normal" rope on GGUF."""
    return np.ascontiguousarray(
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def _in_order(w: np.ndarray, perm: np.ndarray | None) -> np.ndarray:
    """Float rows w (N, K) whose inputs are stored in act-order's order perm -> the inputs in their own order."""
    if perm is None:
        return w
    out = np.empty_like(w)
    out[:, perm] = w
    return out


def _as_f32(a: np.ndarray, gtype: GT) -> np.ndarray:
    if gtype not in _ST_DTYPES.values():  # a block type's rows (FP8, GPTQ's Q4_0/Q8_0) -> their float values (exact)
        return dequantize(a, gtype).reshape(*a.shape[:-1], -1)
    if gtype == GT.BF16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def open_hf(folder: str | os.PathLike) -> HFWeights:
    """Open an HF folder (config.json + *.safetensors, possibly sharded). Raises ModelLoadError."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise ModelLoadError(f"{folder}: not a folder")
    return HFWeights(folder)
