"""Prompt lookup (n-gram speculation): where the context's last n tokens occurred before, the tokens that followed."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def ngram_lookup(tokens, min_n, max_n, k):
    """tokens int64 (L,) -> (start, count): the longest n in [min_n, max_n] whose last-n-token suffix occurs earlier;
    of its most recent earlier occurrence, the up to k tokens after it start at `start`. (0, 0): no match."""
    L = tokens.shape[0]
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        for s in range(L - n - 1, -1, -1):  # the most recent occurrence first: the likeliest continuation
            j = 0
            while j < n and tokens[s + j] == tokens[L - n + j]:
                j += 1
            if j == n:
                start = s + n
                return start, min(k, L - start)
    return 0, 0


def warm_up() -> None:
    ngram_lookup(np.array([1, 2, 3, 1, 2], np.int64), 1, 3, 2)
