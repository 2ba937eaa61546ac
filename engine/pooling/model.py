"""PoolingModel: what a model loaded with runner="pooling" pools with (its pooler config, the classification head and
labels of a sequence-classification checkpoint), the checks a pooling request passes, and each request's pool."""
from __future__ import annotations

from typing import Optional

from engine.model.parts.linear import Linear, has
from engine.pooling.config import PoolerConfig, class_labels, default_runner
from engine.pooling.params import PoolingParams
from engine.pooling.pooler import PoolingState

HEAD = "cls.output.weight"  # a sequence-classification checkpoint's head (HF score.weight)


class PoolingModel:
    def __init__(self, model, model_path: str, pooler_config: Optional[dict]):
        self.model_path, self.hidden_size = model_path, model.config.hidden_size
        self.config = PoolerConfig.for_model(model_path, pooler_config)
        self.classifier = Linear(model.weights, HEAD) if has(model.weights, HEAD) else None
        self.class_labels = class_labels(model_path) if self.classifier is not None else []

    @classmethod
    def build(cls, args, model, model_path: str) -> Optional["PoolingModel"]:
        """None for a generating model (runner generate, or auto on a checkpoint with a language-model head)."""
        runner = args.runner if args.runner != "auto" else default_runner(model_path)
        if args.pooler_config is not None and runner != "pooling":
            raise ValueError("pooler_config is for pooling models: give runner='pooling' too")
        return cls(model, model_path, args.pooler_config) if runner == "pooling" else None

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


def check_kind(pooling: Optional[PoolingModel], params) -> None:
    """A pooling request needs a pooling model, and a pooling model serves nothing else."""
    if pooling is None and isinstance(params, PoolingParams):
        raise ValueError("this model serves generation: embeddings need a pooling model (runner='pooling')")
    if pooling is not None and not isinstance(params, PoolingParams):
        raise ValueError("this model runs as a pooling model (runner='pooling'): it serves embeddings "
                         "(LLM.embed, /v1/embeddings), not generation")
