"""Architecture: everything ramlm knows about one model family, in one place. A subclass in engine/model/archs/
says how its hyperparameters are read (GGUF metadata, HF config.json), how an HF folder's tensors map onto GGUF
names, and what each layer is made of (block(), a BlockSpec); the model, the fused decode path, the GPU path,
the planner's sizes and the synthetic files are all derived from that."""
from __future__ import annotations

from typing import Any

from engine.core.kv_spec import LayerCache
from engine.model.spec import BlockSpec


class Architecture:
    name: str = ""                       # GGUF general.architecture
    hf_model_types: tuple[str, ...] = ()  # config.json model_type values read as this architecture
    embed_scale: bool = False            # embeddings times sqrt(hidden_size) (Gemma)
    rope_neox: bool = True               # RoPE pairs (i, i + d/2); llama's permuted GGUF rows pair (2i, 2i + 1)
    dense_ffn: bool = True               # every layer has a dense MLP of feed_forward_length (False: MoE layers)
    final_norm: bool = True              # output_norm after the last layer (BERT's layers end normed)
    gguf_per_layer_keys: tuple[str, ...] = ()  # GGUF keys that may be per-layer arrays: the shared reader takes
                                               # layer 0's value, gguf_config reads the whole array
    gguf_norm_eps_key: str = "attention.layer_norm_rms_epsilon"  # the norms' epsilon (BERT's LayerNorms: its own)
    # HF folders
    hf_layer_map: dict[str, str] = {}    # per-layer HF module -> GGUF tensor base, beside hf.LAYER_MAP
    hf_model_map: dict[str, str] = {}    # model-level HF tensor (after hf_rename) -> GGUF tensor
    hf_permute_qk: bool = False          # Q/K rows permuted as llama.cpp's converter does for llama
    hf_norm_offset: float = 0.0          # added to every RMSNorm weight (Gemma stores w, GGUF holds 1 + w)
    hf_plain_norms: tuple[str, ...] = () # GGUF norm names hf_norm_offset leaves alone (stored plain in HF too)
    hf_special_map: dict[str, str] = {}  # per-layer HF tensors named without .weight/.bias -> GGUF names
    hf_tie_default: bool = False         # tie_word_embeddings when config.json does not say
    hf_default_rope_theta: float = 10000.0

    def gguf_config(self, m, kw: dict[str, Any]) -> None:
        """Reads this architecture's own GGUF keys (m: gguf_config's metadata reader) into ModelConfig fields."""

    def hf_config(self, cfg: dict, kw: dict[str, Any], need) -> None:
        """Reads this architecture's own config.json keys into ModelConfig fields (need(key): a required key)."""

    def hf_split(self, cfg, suffix: str) -> dict | None:
        """GGUF tensors llama.cpp's converter computes from one per-layer HF tensor (suffix: the name after
        model.layers.{i}., e.g. self_attn.kv_b_proj.weight): {name relative to blk.{i}.: (numpy shape, function of
        the HF array)}, or None where the tensor maps as it is."""
        return None

    def hf_rename(self, name: str, cfg) -> str:
        """An HF tensor name (language-model prefixes already stripped) as the generic maps should see it (Qwen3.5
        moves its mtp.* tensors to the layer after the main ones); cfg: the ModelConfig read from config.json."""
        return name

    def hf_transform(self, name: str, shape: tuple[int, ...], cfg):
        """(GGUF shape, fn) when the HF tensor for GGUF `name` needs llama.cpp's converter's value transform (fn maps
        the float32 array), else None."""
        return None

    def hf_transform_rows(self, name: str, shape: tuple[int, ...], cfg, block: int):
        """hf_transform's moves done on a block type's rows (uint8 (N, row bytes), `block` values per block), when
        they only move whole rows or whole blocks: fn(rows) -> rows, so a quantized checkpoint's weight stays
        quantized; None (the default): the tensor is dequantized and hf_transform maps its float values."""
        return None

    def hf_layer_windows(self, cfg: dict, num_layers: int) -> tuple[int, ...]:
        """Per layer sliding window from config.json when it has no layer_types (0 = full attention)."""
        window = int(cfg.get("sliding_window") or 0)
        return (window,) * num_layers if window > 0 else ()

    def hf_tensor(self, weights, hf_name: str, src, sources: dict) -> bool:
        """Maps an HF tensor this architecture stores its own way (weights.add_tensor) and returns True, or False
        for the generic mapping (hf.LAYER_MAP, stacked experts). sources: every HF name -> its src, for tensors
        that come in parts (gpt-oss's MXFP4 blocks and scales)."""
        return False

    def gguf_metadata(self, cfg) -> dict[str, Any]:
        """This architecture's own GGUF keys (without the `{arch}.` prefix) for a file written from cfg."""
        return {}

    def block(self, cfg, layer: int) -> BlockSpec:
        raise NotImplementedError

    def gguf_tensors(self, cfg) -> dict:
        """Tensors llama.cpp's converter computes for this architecture (not in an HF folder): name -> f32 array."""
        return {}

    def kv_layout(self, cfg) -> tuple[LayerCache, ...]:
        """Each layer's cache, from its BlockSpec: paged blocks (LayerKV) or a per-sequence state (LayerState). The
        runner allocates it, the loader sizes the pools with it, the planner, the placement and `info` count it."""
        return tuple(self.block(cfg, i).kv(cfg) for i in range(cfg.num_layers))

    def per_layer_embedding(self, cfg):
        """A spec.PerLayerEmbeddingSpec when tokens carry per-layer embeddings (computed before the layers)."""
        return None

    def absolute_embedding(self, cfg):
        """A spec.AbsoluteEmbeddingSpec when tokens carry learned absolute positions (BERT), else None."""
        return None

    def model_tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        """Model-level tensors beyond token_embd, output_norm and output (GGUF names, numpy shapes)."""
        out = {}
        for spec in (self.per_layer_embedding(cfg), self.absolute_embedding(cfg)):
            if spec is not None:
                out.update(spec.tensors(cfg))
        return out
