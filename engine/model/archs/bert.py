"""BERT-family encoders (BERT, RoBERTa, XLM-RoBERTa: GTE, BGE, E5 and their cross-encoders): learned absolute
positions and token types, bidirectional attention with biases and no RoPE, post-norm LayerNorm blocks, a GELU MLP.
llama.cpp's `bert` layout: the same tensors under the same names for all three (RoBERTa's offset positions are cut
at load, as its converter cuts them)."""
from __future__ import annotations

from engine.errors import ModelLoadError
from engine.model.architecture import Architecture
from engine.model.pooling_types import POOLING_TYPES
from engine.model.registry import register
from engine.model.spec import AbsoluteEmbeddingSpec, AttentionSpec, BlockSpec, MLPSpec, Residual

PREFIXES = ("bert.", "roberta.")


@register
class Bert(Architecture):
    name = "bert"
    hf_model_types = ("bert", "roberta", "xlm-roberta")
    final_norm = False
    gguf_norm_eps_key = "attention.layer_norm_epsilon"
    hf_layer_map = {"attention.self.query": "attn_q", "attention.self.key": "attn_k",
                    "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
                    "attention.output.LayerNorm": "attn_output_norm", "intermediate.dense": "ffn_up",
                    "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
    hf_model_map = {"embeddings.position_embeddings.weight": "position_embd.weight",
                    "embeddings.token_type_embeddings.weight": "token_types.weight",
                    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
                    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
                    # a sequence classifier: pooled row -> tanh(cls) -> cls.output (BERT's pooler + classifier,
                    # RoBERTa's classification head), llama.cpp's rank pooling
                    "pooler.dense.weight": "cls.weight", "pooler.dense.bias": "cls.bias",
                    "classifier.dense.weight": "cls.weight", "classifier.dense.bias": "cls.bias",
                    "classifier.out_proj.weight": "cls.output.weight", "classifier.out_proj.bias": "cls.output.bias",
                    "classifier.weight": "cls.output.weight", "classifier.bias": "cls.output.bias"}

    def gguf_config(self, m, kw) -> None:
        types = m.md.get("tokenizer.ggml.token_type_count", 2)  # llama.cpp keeps it with the tokenizer's keys
        kw.update(hidden_act="gelu", bidirectional=True, type_vocab_size=int(types),
                  pooling_type=POOLING_TYPES.get(m.num("pooling_type", 2), ""))
        if m.get("attention.causal", False):
            raise ModelLoadError(f"{m.gf.path}: bert.attention.causal is true: a causal BERT is not supported")

    def hf_config(self, cfg: dict, kw, need) -> None:
        kind = cfg.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ModelLoadError(f"{cfg.get('model_type')}: position_embedding_type {kind!r} is not supported "
                                 "(absolute)")
        # RoBERTa's positions start after padding_idx: the table has that many rows more than usable positions
        offset = int(cfg.get("pad_token_id") or 0) + 1 if cfg.get("model_type") != "bert" else 0
        kw.update(rms_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)), bidirectional=True,
                  type_vocab_size=int(cfg.get("type_vocab_size", 2)), pooling_type="CLS",
                  max_position_embeddings=int(need("max_position_embeddings")) - offset)

    def hf_rename(self, name: str, cfg) -> str:
        for p in PREFIXES:
            if name.startswith(p):
                name = name[len(p):]
        if name == "embeddings.word_embeddings.weight":
            return "model.embed_tokens.weight"
        if name.startswith("encoder.layer."):
            return "model.layers." + name[len("encoder.layer."):]
        return name

    def hf_transform(self, name: str, shape: tuple[int, ...], cfg):
        if name != "position_embd.weight" or shape[0] <= cfg.max_position_embeddings:
            return None
        offset = shape[0] - cfg.max_position_embeddings  # RoBERTa: row padding_idx + 1 is position 0
        return (cfg.max_position_embeddings, shape[1]), lambda w: w[offset:]

    def gguf_metadata(self, cfg) -> dict:
        codes = {v: k for k, v in POOLING_TYPES.items()}
        return {"attention.layer_norm_epsilon": float(cfg.rms_norm_eps), "attention.causal": False,
                "tokenizer.ggml.token_type_count": cfg.type_vocab_size, "pooling_type": codes.get(cfg.pooling_type, 2)}

    def absolute_embedding(self, cfg):
        return AbsoluteEmbeddingSpec(cfg.max_position_embeddings, cfg.type_vocab_size)

    def block(self, cfg, layer: int):
        attn = AttentionSpec(None, qkv_bias=True, o_bias=True, bidirectional=True)
        return BlockSpec((Residual(attn, None, after="attn_output_norm"),
                          Residual(MLPSpec(cfg.hidden_act), None, after="layer_output_norm")), norm="layer")
