"""Suffix decoding's trees (arXiv 2411.04975, the structure Arctic Inference and vLLM's "suffix" method use): every
suffix of the sequences put in, cut at a maximum depth, as a trie whose nodes count how often their path occurs. A
draft follows, from the node a context's suffix leads to, the most frequent child at each step while the product of
the step probabilities (child count / node count) stays at or above a floor.

A tree is an int32 node table (one row per node, columns below; row 0 is the root) with each node's children in a
sibling list, except the root's: its fan-out is the vocabulary, so they are found through an open-addressing hash
(keys, values: token -> node); meta = [rows used, head of the free list, hash slots used]. Callers make room
(make_room) before an insert."""
from __future__ import annotations

import numpy as np
from numba import njit

EMPTY, GONE = -1, -2  # hash keys: a never-used slot, a removed one
TOK, CNT, PARENT, CHILD, SIB, HEAD, DEPTH = range(7)  # a node's token, count, parent, first child, next sibling,
NCOLS = 7                                             # most frequent child, depth (root 0)


def new_tree(capacity: int = 1024):
    """(nodes, keys, values, meta) of an empty tree."""
    nodes = np.full((capacity, NCOLS), -1, np.int32)
    nodes[0, CNT], nodes[0, DEPTH] = 0, 0
    return nodes, np.full(256, EMPTY, np.int32), np.zeros(256, np.int32), np.array([1, -1, 0], np.int64)


def make_room(nodes, keys, values, meta, num_tokens: int, max_depth: int):
    """The tree's arrays, grown (new ones) where inserting num_tokens tokens could overflow them."""
    need = int(meta[0]) + num_tokens * max_depth
    if need > nodes.shape[0]:
        bigger = np.full((max(need, 2 * nodes.shape[0]), NCOLS), -1, np.int32)
        bigger[:nodes.shape[0]] = nodes
        nodes = bigger
    if 2 * (int(meta[2]) + num_tokens) > keys.shape[0]:  # load (tombstones included) at most one half
        live = int(np.count_nonzero(keys >= 0))  # sized by the live keys: removals' tombstones go
        size = 256
        while 2 * (live + num_tokens) > size:
            size *= 2
        keys, values = _rehash(keys, values, meta, size)
    return nodes, keys, values


@njit(cache=True)
def _slot(keys, token):
    """Where token is, or the first free slot of its probe sequence (tombstones are passed, not reused)."""
    mask = keys.shape[0] - 1
    i = (token * 2654435761) & mask
    while keys[i] != token and keys[i] != EMPTY:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _rehash(keys, values, meta, size):
    new_keys, new_values = np.full(size, EMPTY, np.int32), np.zeros(size, np.int32)
    live = 0
    for i in range(keys.shape[0]):
        if keys[i] >= 0:
            j = _slot(new_keys, keys[i])
            new_keys[j], new_values[j] = keys[i], values[i]
            live += 1
    meta[2] = live
    return new_keys, new_values


@njit(cache=True)
def _find_child(nodes, keys, values, node, token):
    if node == 0:
        i = _slot(keys, token)
        return values[i] if keys[i] == token else -1
    c = nodes[node, CHILD]
    while c >= 0 and nodes[c, TOK] != token:
        c = nodes[c, SIB]
    return c


@njit(cache=True)
def _new_node(nodes, keys, values, meta, parent, token):
    n = meta[1]
    if n >= 0:  # reuse a freed row
        meta[1] = nodes[n, SIB]
    else:
        n = meta[0]
        meta[0] += 1
    nodes[n, TOK], nodes[n, CNT], nodes[n, PARENT] = token, 0, parent
    nodes[n, CHILD], nodes[n, HEAD], nodes[n, DEPTH] = -1, -1, nodes[parent, DEPTH] + 1
    if parent == 0:
        i = _slot(keys, token)
        keys[i], values[i] = token, n
        meta[2] += 1
    else:
        nodes[n, SIB] = nodes[parent, CHILD]
        nodes[parent, CHILD] = n
    return n


@njit(cache=True)
def extend(nodes, keys, values, meta, active, num_active, tokens, max_depth):
    """Appends tokens to one sequence already in the tree. active[:num_active]: the nodes where its suffixes shorter
    than max_depth end (the caller's, updated in place; room for max_depth). Returns the new num_active. Needs
    len(tokens) * max_depth free rows."""
    for t in tokens:
        nodes[0, CNT] += 1
        m = 0
        for j in range(num_active + 1):  # each open suffix grows by t; a new one starts at the root
            node = active[j] if j < num_active else 0
            c = _find_child(nodes, keys, values, node, t)
            if c < 0:
                c = _new_node(nodes, keys, values, meta, node, t)
            nodes[c, CNT] += 1
            h = nodes[node, HEAD]
            if node != 0 and (h < 0 or nodes[c, CNT] > nodes[h, CNT]):  # no draft starts at the root
                nodes[node, HEAD] = c
            if nodes[c, DEPTH] < max_depth:
                active[m] = c
                m += 1
        num_active = m
    return num_active


@njit(cache=True)
def remove(nodes, keys, values, meta, tokens, max_depth):
    """Takes one whole sequence (as it was put in) back out: each of its depth-cut suffixes' counts, freeing the
    nodes no other sequence reaches."""
    n = tokens.shape[0]
    for i in range(n):
        nodes[0, CNT] -= 1
        node = 0
        for j in range(i, min(n, i + max_depth)):
            c = _find_child(nodes, keys, values, node, tokens[j])
            nodes[c, CNT] -= 1
            node = c
        # back up from the deepest node: free emptied nodes, re-pick each parent's most frequent child
        while node != 0:
            parent = nodes[node, PARENT]
            if nodes[node, CNT] == 0:
                _unlink(nodes, keys, meta, parent, node)
            if parent == 0:
                break
            best, c = -1, nodes[parent, CHILD]
            while c >= 0:
                if best < 0 or nodes[c, CNT] > nodes[best, CNT]:
                    best = c
                c = nodes[c, SIB]
            nodes[parent, HEAD] = best
            node = parent


@njit(cache=True)
def _unlink(nodes, keys, meta, parent, node):
    if parent == 0:
        keys[_slot(keys, nodes[node, TOK])] = GONE  # still counted in meta[2] until a rehash
    else:
        c, prev = nodes[parent, CHILD], -1
        while c != node:
            prev, c = c, nodes[c, SIB]
        if prev < 0:
            nodes[parent, CHILD] = nodes[node, SIB]
        else:
            nodes[prev, SIB] = nodes[node, SIB]
    nodes[node, SIB] = meta[1]  # onto the free list (its children were freed before it: their counts reached 0)
    meta[1] = node


@njit(cache=True)
def speculate(nodes, keys, values, context, max_tokens, max_spec_factor, max_spec_offset, min_token_prob, out):
    """For each suffix length m of context (1, 2, ... while the tree holds it), a draft of up to
    min(max_tokens, m * factor + offset) tokens along the most frequent children while the path probability is at
    least min_token_prob; the draft with the highest score (sum of its tokens' path probabilities; the longer match
    on a tie) goes into out. Returns (number of tokens, score, match length)."""
    L = context.shape[0]
    best_n, best_score, best_m = 0, 0.0, 0
    buf = np.empty(out.shape[0], np.int32)
    for m in range(1, L):
        node = 0
        for j in range(L - m, L):
            node = _find_child(nodes, keys, values, node, context[j])
            if node < 0:
                break
        if node < 0:
            break
        limit = min(max_tokens, int(m * max_spec_factor + max_spec_offset + 1e-6), out.shape[0])
        n, score, prob = 0, 0.0, 1.0
        while n < limit:
            c = nodes[node, HEAD]
            if c < 0:
                break
            prob *= nodes[c, CNT] / nodes[node, CNT]
            if prob < min_token_prob:
                break
            buf[n] = nodes[c, TOK]
            score += prob
            n += 1
            node = c
        if score >= best_score:
            best_n, best_score, best_m = n, score, m
            out[:n] = buf[:n]
    return best_n, best_score, best_m


def warm_up() -> None:
    nodes, keys, values, meta = new_tree(64)
    tokens = np.array([1, 2, 3, 1, 2], np.int32)
    nodes, keys, values = make_room(nodes, keys, values, meta, len(tokens), 4)
    extend(nodes, keys, values, meta, np.zeros(4, np.int32), 0, tokens, 4)
    speculate(nodes, keys, values, np.array([1, 2], np.int32), 3, 1.0, 0.0, 0.1, np.zeros(3, np.int32))
    remove(nodes, keys, values, meta, tokens, 4)
