"""PoolingModel: what a model loaded with runner="pooling" pools with (its pooler config, the classification head and
labels of a sequence-classification checkpoint, or a head made from two tokens' output rows: hf_overrides), the checks a pooling request passes, and each request's pool."""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
from gguf import GGMLQuantizationType as GT

from cpu_kernels.quant.linear import QuantLinear
from cpu_kernels.quant.qtypes import dequantize
from engine.model.parts.linear import Linear, has
from engine.pooling.config import PoolerConfig, class_labels, default_runner
from engine.pooling.params import PoolingParams
from engine.pooling.pooler import PoolingState

HEAD = "cls.output.weight"  # a sequence-classification checkpoint's head (HF score.weight, BERT's classifier)
DENSE = "cls.weight"        # BERT's pooler / RoBERTa's classifier.dense before it, through tanh
# sentence-transformers' Dense modules after the pooling, as llama.cpp's converter stores them (EmbeddingGemma)
DENSE_PROJECTIONS = ("dense_2.weight", "dense_3.weight")


class PoolingModel:
    def __init__(self, model, model_path: str, pooler_config: Optional[dict], two_way: Optional[list[int]] = None):
        self.model_path, self.hidden_size = model_path, model.config.hidden_size
        self.config = PoolerConfig.for_model(model_path, pooler_config, model.config.pooling_type or "LAST")
        if not self.config.dense and has(model.weights, DENSE_PROJECTIONS[0]):  # a GGUF's sentence-transformers Dense
            self.config = dataclasses.replace(self.config, dense=tuple(
                (float_rows(model.weights, n).astype(np.float64), None, "identity")
                for n in DENSE_PROJECTIONS if has(model.weights, n)))
        if self.config.dense:  # the vector's size is the last Dense projection's
            self.hidden_size = self.config.dense[-1][0].shape[0]
        if two_way is not None:
            self.classifier = two_way_head(model, two_way)
        else:
            self.classifier = ClassifierHead(model.weights) if has(model.weights, HEAD) else None
        self.class_labels = class_labels(model_path) if self.classifier is not None and two_way is None else []

    @classmethod
    def build(cls, args, model, model_path: str, tokenizer=None) -> Optional["PoolingModel"]:
        """None for a generating model (runner generate, or auto on a checkpoint with a language-model head)."""
        runner = args.runner
        if runner == "auto":  # an encoder (bidirectional attention: BERT, EmbeddingGemma) only pools
            runner = "pooling" if model.config.bidirectional else default_runner(model_path, args.hf_overrides)
        if args.pooler_config is not None and runner != "pooling":
            raise ValueError("pooler_config is for pooling models: give runner='pooling' too")
        tokens = (args.hf_overrides or {}).get("classifier_from_token")
        if tokens is not None and runner != "pooling":
            raise ValueError("hf_overrides classifier_from_token makes a classifier: give runner='pooling' (or "
                             "architectures [...ForSequenceClassification]) too")
        two_way = None
        if tokens is not None:
            two_way = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
            if None in two_way:
                raise ValueError(f"hf_overrides classifier_from_token {tokens}: not tokens of this model's vocabulary")
        return cls(model, model_path, args.pooler_config, two_way) if runner == "pooling" else None

    def check(self, params: PoolingParams) -> None:
        """ValueError for a pooling request this model cannot serve."""
        if params.task == "classify" and self.classifier is None:
            raise ValueError("this model has no classification head (a *ForSequenceClassification checkpoint's "
                             "score.weight): it serves embeddings, not classify")
        if params.task == "classify" and params.normalize is not None:
            raise ValueError("normalize is for embeddings, not classify")
        d = params.dimensions
        if d is None:
            return
        if params.task == "classify":
            raise ValueError("dimensions is for embeddings, not classify")
        if not self.config.matryoshka:
            raise ValueError(f'Model "{self.model_path}" does not support matryoshka representation, changing '
                             f"output dimensions will lead to poor results.")
        if d > self.hidden_size:
            raise ValueError(f"dimensions {d} is more than the model's hidden size ({self.hidden_size})")
        if self.config.matryoshka_dimensions and d not in self.config.matryoshka_dimensions:
            raise ValueError(f"dimensions {d} is not one of the model's matryoshka_dimensions "
                             f"{list(self.config.matryoshka_dimensions)}")

    def new_pool(self, params: PoolingParams) -> PoolingState:
        return PoolingState(self.config, params, self.classifier)


class ClassifierHead:
    """Pooled rows -> class logits: cls.output (+ bias), after tanh(cls (+ bias)) where the model has that dense layer
    (BERT's pooler, RoBERTa's classification head; llama.cpp's rank pooling)."""

    def __init__(self, ws):
        self.dense = Linear(ws, DENSE, "cls.bias") if has(ws, DENSE) else None
        self.out = Linear(ws, HEAD, "cls.output.bias")

    @property
    def out_features(self) -> int:
        return self.out.out_features

    def __call__(self, x: np.ndarray, per_row: bool = False) -> np.ndarray:
        if self.dense is not None:
            x = np.tanh(self.dense(x, per_row=per_row))
        return self.out(x, per_row=per_row)


def two_way_head(model, ids: list[int]) -> Linear:
    """vLLM's from_2_way_softmax: a one-label head, the output matrix's row of the second token minus the first's, so
    that its sigmoid is the second token's probability against the first (Qwen3-Reranker's P(yes) over no/yes)."""
    ws = model.weights
    rows = float_rows(ws, "output.weight" if has(ws, "output.weight") else "token_embd.weight", ids)
    w = np.ascontiguousarray((rows[1].astype(np.float64) - rows[0]).astype(np.float32)[None])
    return Linear.of(QuantLinear.from_raw(GT.F32, w, w.shape))


def float_rows(ws, name: str, ids=None) -> np.ndarray:
    """Rows ids (default: all) of a 2-D weight as float32, whatever its type (gguf's dequantize for block types)."""
    info = ws.info(name)
    rows = np.asarray(ws.raw(name))
    rows = rows if ids is None else rows[ids]
    if info.ggml_type in (GT.F32, GT.F16):
        return rows.astype(np.float32)
    if info.ggml_type == GT.BF16:
        return (rows.astype(np.uint32) << 16).view(np.float32)
    return dequantize(rows, info.ggml_type).reshape(rows.shape[0], -1)


def check_kind(pooling: Optional[PoolingModel], params) -> None:
    """A pooling request needs a pooling model, and a pooling model serves nothing else."""
    if pooling is None and isinstance(params, PoolingParams):
        raise ValueError("this model serves generation: embeddings need a pooling model (runner='pooling')")
    if pooling is not None and not isinstance(params, PoolingParams):
        raise ValueError("this model runs as a pooling model (runner='pooling'): it serves embeddings "
                         "(LLM.embed, /v1/embeddings), not generation")
