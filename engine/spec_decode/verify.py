"""Checking drafts against the target model: greedy rows keep the drafts their argmax agrees with, then one token of
their own (the correction at the first disagreement, or the bonus token after the last draft)."""
from __future__ import annotations

import numpy as np


def accept_greedy(logits: np.ndarray, drafts) -> list[int]:
    """logits f32 (k + 1, V): the rows of the last sampled token and of each of the k drafts -> the tokens the
    request gets this step (1 to k + 1), exactly what k + 1 greedy steps would have given."""
    best = np.argmax(logits, axis=1)
    out = []
    for i, d in enumerate(drafts):
        out.append(int(best[i]))
        if best[i] != d:
            return out
    out.append(int(best[len(drafts)]))
    return out
