"""ModelMeta: what the planner needs to know about a model, read from its weights without building it
(shapes, formats, bytes of every tensor, grouped by layer), or made up from a shape description so that
plans for 8B or 30B models can be tested without multi-GB files.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class TensorMeta:
    name: str
    ggml_type: str          # GGMLQuantizationType name: Q4_K, F32, ...
    shape: tuple[int, ...]  # numpy order, as TensorInfo
    nbytes: int             # bytes as stored (GGUF blocks)

    @property
    def layer(self) -> int | None:
        m = _LAYER.match(self.name)
        return int(m.group(1)) if m else None

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def is_expert(self) -> bool:
        """Routed-expert weights (stacked per layer); shared experts (_shexp) count as dense."""
        return "_exps." in self.name

    @property
    def is_matrix(self) -> bool:
        return len(self.shape) >= 2


@dataclass(frozen=True)
class ModelMeta:
    name: str
    arch: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    tensors: tuple[TensorMeta, ...] = ()
    # Hybrid models (linear attention): the layers with paged K/V (None: all) and each layer's state bytes per sequence
    kv_layers: tuple[int, ...] | None = None
    state_bytes: tuple[int, ...] = ()

    def has_kv(self, layer: int) -> bool:
        return self.kv_layers is None or layer in self.kv_layers

    def state_bytes_of(self, layer: int) -> int:
        """One sequence's state in this layer (0 for an attention layer)."""
        return self.state_bytes[layer] if self.state_bytes else 0

    def layer_tensors(self, layer: int) -> list[TensorMeta]:
        return [t for t in self.tensors if t.layer == layer]

    def tensor(self, name: str) -> TensorMeta | None:
        return next((t for t in self.tensors if t.name == name), None)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def is_moe(self) -> bool:
        return any(t.is_expert for t in self.tensors)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tensors"] = len(self.tensors)
        return d


def model_meta(ws) -> ModelMeta:
    """From an open WeightSource (engine.model.weights.open_weights): config and per-tensor bytes."""
    cfg = ws.config
    names = ws.names()
    tensors = []
    for n in names:
        info = ws.info(n)
        tensors.append(TensorMeta(n, Q(info.ggml_type).name, tuple(int(s) for s in info.shape), int(info.nbytes)))
    tied = bool(cfg.tie_word_embeddings) or "output.weight" not in names
    name = cfg.name or os.path.basename(os.fspath(ws.path).rstrip("/"))
    return ModelMeta(name, cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size,
                     cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.max_position_embeddings, tied,
                     cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, tuple(tensors),
                     *_cache_fields(cfg))


def _cache_fields(cfg) -> tuple:
    """(kv_layers, state_bytes) of ModelMeta: None and () for a model whose every layer keeps paged K/V."""
    from engine.model.cache_layout import cache_layout
    layout = cache_layout(cfg)
    if not layout.hybrid:
        return None, ()
    return layout.kv_layers, tuple(layout.state_bytes_per_layer(i) for i in range(cfg.num_layers))


def model_meta_from_path(path: str) -> ModelMeta:
    from engine.model.weights import open_weights
    return model_meta(open_weights(path))


# ---------------------------------------------------------------- synthetic models
SHAPES: dict[str, dict] = {
    "llama-8b": dict(arch="llama", num_layers=32, hidden_size=4096, intermediate_size=14336, num_heads=32,
                     num_kv_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072),
    "llama-70b": dict(arch="llama", num_layers=80, hidden_size=8192, intermediate_size=28672, num_heads=64,
                      num_kv_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072),
    "qwen3-8b": dict(arch="qwen3", num_layers=36, hidden_size=4096, intermediate_size=12288, num_heads=32,
                     num_kv_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960),
    "qwen3-moe-30b-a3b": dict(arch="qwen3moe", num_layers=48, hidden_size=2048, intermediate_size=6144,
                              num_heads=32, num_kv_heads=4, head_dim=128, vocab_size=151936,
                              max_position_embeddings=40960, num_experts=128, num_experts_per_tok=8,
                              moe_intermediate_size=768),
    "gemma-3-270m": dict(arch="gemma3", num_layers=18, hidden_size=640, intermediate_size=2048, num_heads=4,
                         num_kv_heads=1, head_dim=256, vocab_size=262144, max_position_embeddings=32768,
                         tie_word_embeddings=True),
    # Qwen3.5/3.6: three Gated DeltaNet layers (a state per sequence, no KV) for every gated-attention layer
    "qwen3.5-27b": dict(arch="qwen35", num_layers=64, hidden_size=5120, intermediate_size=17408, num_heads=24,
                        num_kv_heads=4, head_dim=256, vocab_size=248320, max_position_embeddings=262144,
                        rope_dim=64, linear_layers=tuple(i for i in range(64) if (i + 1) % 4), ssm_conv_kernel=4,
                        ssm_num_k_heads=16, ssm_num_v_heads=48, ssm_k_head_dim=128, ssm_v_head_dim=128),
    "qwen3.5-35b-a3b": dict(arch="qwen35moe", num_layers=40, hidden_size=2048, intermediate_size=0, num_heads=16,
                            num_kv_heads=2, head_dim=256, vocab_size=248320, max_position_embeddings=262144,
                            num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                            shared_expert_intermediate_size=512, rope_dim=64,
                            linear_layers=tuple(i for i in range(40) if (i + 1) % 4), ssm_conv_kernel=4,
                            ssm_num_k_heads=16, ssm_num_v_heads=32, ssm_k_head_dim=128, ssm_v_head_dim=128),
}
QUANTS = ("q4_k_m", "q4_0", "q8_0", "q6_k", "f16", "bf16", "f32")


def _use_more_bits(i: int, n: int) -> bool:
    # llama.cpp's rule for the Q4_K_M / Q5_K_M tensors that get Q6_K
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _qtype(quant: str, name: str, layer: int | None, n_layers: int, tied: bool) -> Q:
    if quant == "q4_k_m":
        if name == "output.weight" or (name == "token_embd.weight" and tied):
            return Q.Q6_K
        if (".attn_v." in name or ".ffn_down" in name) and layer is not None and _use_more_bits(layer, n_layers):
            return Q.Q6_K
        return Q.Q4_K
    return Q[quant.upper()]


def layer_tensor_shapes(s: dict, layer: int) -> list[tuple[str, tuple[int, ...]]]:
    """GGUF names and shapes of one layer's tensors for a shape description (see SHAPES): the architecture's
    BlockSpec for that layer says what they are."""
    from engine.model.registry import architecture
    cfg = shape_config(s)
    return [(f"blk.{layer}.{n}", shape) for n, shape in architecture(cfg.arch).block(cfg, layer).tensors(cfg).items()]


def shape_config(s: dict):
    """The ModelConfig of a shape description (its ModelConfig keys; the required ones 0 when absent)."""
    from dataclasses import fields

    from engine.model.config import ModelConfig
    names = {f.name for f in fields(ModelConfig)}
    required = ("arch", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                "head_dim")
    return ModelConfig(**{**{k: 0 for k in required}, **{k: v for k, v in s.items() if k in names}})


def synthetic_meta(shape: str | dict, quant: str = "q4_k_m", name: str | None = None) -> ModelMeta:
    """ModelMeta of a model of the given shape (a SHAPES key or a dict with the same keys) in a GGUF
    quantization scheme (QUANTS; q4_k_m follows llama.cpp's choice of Q6_K tensors). No file is written."""
    s = dict(SHAPES[shape]) if isinstance(shape, str) else dict(shape)
    s.setdefault("tie_word_embeddings", False)
    s.setdefault("max_position_embeddings", 4096)
    quant = quant.lower()
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {', '.join(QUANTS)}, got {quant!r}")
    L, H, V, tied = s["num_layers"], s["hidden_size"], s["vocab_size"], s["tie_word_embeddings"]
    shapes = [("token_embd.weight", (V, H)), ("output_norm.weight", (H,))]
    if not tied:
        shapes.append(("output.weight", (V, H)))
    for i in range(L):
        shapes += layer_tensor_shapes(s, i)
    tensors = []
    for n, shp in shapes:
        layer = int(_LAYER.match(n).group(1)) if _LAYER.match(n) else None
        small = len(shp) == 1 or "ffn_gate_inp" in n or "ssm_conv1d" in n  # F32 in llama.cpp's files too
        t = Q.F32 if small else _qtype(quant, n, layer, L, tied)
        tensors.append(TensorMeta(n, t.name, shp, _nbytes(t, shp)))
    label = name or (shape if isinstance(shape, str) else s.get("name", "synthetic")) + f"-{quant}"
    return ModelMeta(label, s["arch"], L, H, s["intermediate_size"], V, s["num_heads"], s["num_kv_heads"],
                     s["head_dim"], s["max_position_embeddings"], tied, s.get("num_experts", 0),
                     s.get("num_experts_per_tok", 0), s.get("moe_intermediate_size", 0), tuple(tensors),
                     *_cache_fields(shape_config(s)))


def _nbytes(t: Q, shape: tuple[int, ...]) -> int:
    block, size = gguf.GGML_QUANT_SIZES[t]
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return rows * (shape[-1] // block) * size
