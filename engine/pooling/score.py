"""Scores (vLLM's score task): from an embedding model, the cosine similarity of two texts' vectors; from a cross-encoder
(a sequence-classification model with one label: rerankers, reward models), the sigmoid of its logit over the two
texts joined (cross_encoder_input); and the pairing of vLLM's LLM.score / /score: one to one, one to many, or many to
many pairwise."""
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


def cross_encoder_input(tokenizer, num_types: int, first, second) -> dict:
    """One pair's prompt for a cross-encoder; first and second are texts or token-id lists. A model with token types
    (BERT's segments, num_types > 0): two texts through the tokenizer's pair template with its type ids, token ids
    joined with the second's typed 1 (0 where the model has one type). A decoder: the first's tokens, then the
    second's without special tokens (Qwen3-Reranker's form)."""
    if num_types and isinstance(first, str) and isinstance(second, str):
        ids, types = tokenizer.encode_pair(first, second)
        return {"prompt_token_ids": ids, "token_type_ids": types}
    a = tokenizer.encode(first) if isinstance(first, str) else [int(t) for t in first]
    b = tokenizer.encode(second, add_special_tokens=False) if isinstance(second, str) else [int(t) for t in second]
    prompt = {"prompt_token_ids": a + b}
    if num_types:
        prompt["token_type_ids"] = [0] * len(a) + [min(1, num_types - 1)] * len(b)
    return prompt


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))
