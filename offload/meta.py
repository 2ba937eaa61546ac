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

from cpu_kernels.quant.qtypes import qtype
from engine.core.kv_spec import LayerCache, LayerKV, is_paged

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
    # each layer's cache (Architecture.kv_layout: core/kv_spec.LayerKV, or LayerState for a linear-attention layer);
    # (): K and V of the kv heads in every layer
    kv_layout: tuple[LayerCache, ...] = ()

    def layer_cache(self, layer: int) -> LayerCache:
        return self.kv_layout[layer] if self.kv_layout else LayerKV(self.num_kv_heads, self.head_dim)

    def has_kv(self, layer: int) -> bool:
        """The layer keeps paged blocks of its own (not a per-sequence state, not another layer's: Gemma 4's KV
        sharing)."""
        cache = self.layer_cache(layer)
        return is_paged(cache) and cache.shared_from < 0

    def state_bytes_of(self, layer: int) -> int:
        """One sequence's state in this layer (0 for a paged layer)."""
        return self.layer_cache(layer).bytes_per_sequence

    @property
    def has_states(self) -> bool:
        """Some layers keep a per-sequence state (a hybrid model: the planner counts state pools)."""
        return any(self.state_bytes_of(i) for i in range(self.num_layers))

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

    @property
    def kv(self) -> LayerKV:
        """The paged layers' cache as the planner counts it, every one alike: the largest paged layer's."""
        paged = [self.layer_cache(i) for i in range(self.num_layers) if self.has_kv(i)]
        return max(paged, key=lambda k: k.bytes_per_block(1, "fp16"), default=LayerKV(self.num_kv_heads,
                                                                                       self.head_dim))

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
        tensors.append(TensorMeta(n, qtype(info.ggml_type).name, tuple(int(s) for s in info.shape), int(info.nbytes)))
    tied = bool(cfg.tie_word_embeddings) or "output.weight" not in names
    name = cfg.name or os.path.basename(os.fspath(ws.path).rstrip("/"))
    return ModelMeta(name, cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size,
                     cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.max_position_embeddings, tied,
                     cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, tuple(tensors),
                     _kv_layout(cfg))


def _kv_layout(cfg) -> tuple[LayerCache, ...]:
    """Each layer's cache, as the architecture's BlockSpecs declare it."""
    from engine.model.registry import architecture
    return architecture(cfg.arch).kv_layout(cfg)


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
    "gpt-oss-20b": dict(arch="gpt-oss", num_layers=24, hidden_size=2880, intermediate_size=2880, num_heads=64,
                        num_kv_heads=8, head_dim=64, vocab_size=201088, max_position_embeddings=131072,
                        num_experts=32, num_experts_per_tok=4, moe_intermediate_size=2880,
                        layer_sliding_window=tuple(128 if i % 2 == 0 else 0 for i in range(24))),
    # DeepSeek-V3's dims with 3 of its 61 layers (one dense, two MoE): the latent cache, 256 experts
    "deepseek-v3-3l": dict(arch="deepseek2", num_layers=3, hidden_size=7168, intermediate_size=18432, num_heads=128,
                           num_kv_heads=1, head_dim=192, vocab_size=129280, max_position_embeddings=163840,
                           num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048, rope_dim=64,
                           value_head_dim=128, q_lora_rank=1536, kv_lora_rank=512, expert_shared_count=1,
                           expert_group_count=8, expert_group_used_count=4, expert_weights_scale=2.5,
                           expert_gating="sigmoid", expert_selection_bias=True, dense_layers=(0,)),
    "gemma4-26b-a4b": dict(arch="gemma4", num_layers=30, hidden_size=2816, intermediate_size=2112, num_heads=16,
                           num_kv_heads=8, head_dim=256, head_dim_global=512, num_kv_heads_global=2, attn_k_eq_v=True,
                           rope_pairs_global=64, vocab_size=262144, max_position_embeddings=262144,
                           tie_word_embeddings=True, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=704,
                           layer_sliding_window=tuple(0 if (i + 1) % 6 == 0 else 1024 for i in range(30))),
    "gemma-3-270m": dict(arch="gemma3", num_layers=18, hidden_size=640, intermediate_size=2048, num_heads=4,
                         num_kv_heads=1, head_dim=256, vocab_size=262144, max_position_embeddings=32768,
                         tie_word_embeddings=True, layer_sliding_window=tuple(0 if i % 6 == 5 else 512 for i in range(18))),
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
QUANTS = ("q4_k_m", "q4_0", "q8_0", "q6_k", "f16", "bf16", "f32", "mxfp4")


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
    if quant == "mxfp4":  # llama.cpp's MOSTLY_MXFP4_MOE (gpt-oss): MXFP4 experts, Q8_0 elsewhere
        return Q.MXFP4 if "_exps." in name else Q.Q8_0
    return Q[quant.upper()]


def shape_config(s: dict):
    """The ModelConfig of a shape description (see SHAPES): its keys that are ModelConfig fields, 0 for the
    required ones it leaves out."""
    import dataclasses
    from engine.model.config import ModelConfig
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    kw = {k: v for k, v in s.items() if k in fields}
    for name, f in fields.items():
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kw.setdefault(name, 0)
    return ModelConfig(**kw)


# llama.cpp's quantize: a k-quant whose rows do not fill its 256-value blocks takes this type instead
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.Q2_K: Q.IQ4_NL, Q.Q3_K: Q.IQ4_NL,
            Q.IQ4_XS: Q.IQ4_NL}


def fit_rows(t: Q, shape: tuple[int, ...]) -> Q:
    """t, or llama.cpp's replacement where shape's rows are not whole blocks of t (DeepSeek's attn_k_b rows are
    128 wide); F16 where no block type fits."""
    while shape[-1] % gguf.GGML_QUANT_SIZES[t][0]:
        t = FALLBACK.get(t, Q.F16)
    return t


def layer_tensor_shapes(s: dict, layer: int) -> list[tuple[str, tuple[int, ...]]]:
    """GGUF names and shapes of one layer's tensors for a shape description (see SHAPES): the architecture's
    BlockSpec for that layer says what they are."""
    from engine.model.registry import architecture
    cfg = shape_config(s)
    return [(f"blk.{layer}.{n}", shape) for n, shape in architecture(cfg.arch).block(cfg, layer).tensors(cfg).items()]


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
    from engine.model.registry import architecture
    cfg = shape_config(s)
    shapes += list(architecture(cfg.arch).model_tensors(cfg).items())  # per-layer embeddings (Gemma 4), ...
    for i in range(L):
        shapes += layer_tensor_shapes(s, i)
    tensors = []
    for n, shp in shapes:
        layer = int(_LAYER.match(n).group(1)) if _LAYER.match(n) else None
        small = (len(shp) == 1 or "ffn_gate_inp" in n or n.endswith(".bias")  # experts' biases are (E, N)
                 or "ssm_conv1d" in n)  # F32 in llama.cpp's files too
        t = Q.F32 if small else fit_rows(_qtype(quant, n, layer, L, tied), shp)
        tensors.append(TensorMeta(n, t.name, shp, _nbytes(t, shp)))
    label = name or (shape if isinstance(shape, str) else s.get("name", "synthetic")) + f"-{quant}"
    return ModelMeta(label, s["arch"], L, H, s["intermediate_size"], V, s["num_heads"], s["num_kv_heads"],
                     s["head_dim"], s["max_position_embeddings"], tied, s.get("num_experts", 0),
                     s.get("num_experts_per_tok", 0), s.get("moe_intermediate_size", 0), tuple(tensors),
                     _kv_layout(shape_config(s)))


def _nbytes(t: Q, shape: tuple[int, ...]) -> int:
    block, size = gguf.GGML_QUANT_SIZES[t]
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return rows * (shape[-1] // block) * size
