"""Scores (vLLM's score task): from an embedding model, the cosine similarity of two texts' vectors; from a cross-encoder
(a sequence-classification model with one label: rerankers, reward models), the sigmoid of its logit over the two
texts joined (the second's tokens after the first's, without its special tokens); and the pairing of vLLM's
LLM.score / /score: one to one, one to many, or many to many pairwise."""
from __future__ import annotations

import numpy as np


def pair_up(first, second) -> list[tuple[int, int]]:
    """(index into first, index into second) of each pair: one text against each of the other side's, or equal-length
    lists pairwise."""
    if not first or not second:
        raise ValueError("both sides of a score need at least one input")
    if len(first) == 1:
        return [(0, j) for j in range(len(second))]
    if len(first) != len(second):
        raise ValueError(f"text_1 has {len(first)} inputs and text_2 {len(second)}: give one text_1, or as many as "
                         f"text_2")
    return [(i, i) for i in range(len(first))]


def is_cross_encoder(pooling) -> bool:
    """A pooling model (PoolingModel) whose classification head gives one score."""
    return pooling is not None and pooling.classifier is not None and pooling.classifier.out_features == 1


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))
