"""Suffix decoding's trees (cpu_kernels/suffix_tree.py, engine/spec_decode/suffix.py) against plain references: the
counts of every depth-cut substring, each node's most frequent child, drafts as the published algorithm defines them
(best score over match lengths, path probability floor, length factor), and sequences taken back out."""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from cpu_kernels import suffix_tree as st
from engine.spec_decode.suffix import SuffixTree


class Reference:
    """Counts per substring and, per substring, its most frequent continuation as the tree picks it (a child replaces
    the current one when its count passes it)."""

    def __init__(self, depth):
        self.depth, self.counts, self.head, self.seqs = depth, Counter(), {}, {}

    def extend(self, seq, tokens):
        old = self.seqs.setdefault(seq, [])
        for t in tokens:
            old.append(t)
            for start in range(max(0, len(old) - self.depth), len(old)):
                path = tuple(old[start:])
                self.counts[path] += 1
                parent = path[:-1]
                if parent and (parent not in self.head or self.counts[path] > self.counts[self.head[parent]]):
                    self.head[parent] = path

    def speculate(self, context, max_tokens, factor, min_prob):
        best = ([], 0.0)
        for m in range(1, len(context)):
            node = tuple(context[-m:])
            if node not in self.counts:
                break
            limit = min(max_tokens, int(m * factor + 1e-6))
            draft, score, prob = [], 0.0, 1.0
            while len(draft) < limit and node in self.head:
                child = self.head[node]
                prob *= self.counts[child] / self.counts[node]
                if prob < min_prob:
                    break
                draft.append(child[-1])
                score += prob
                node = child
            if score >= best[1]:
                best = (draft, score)
        return best


def tree_counts(tree: SuffixTree) -> Counter:
    """Every path's count, read from the node table; checks that each node's head is a most frequent child."""
    nodes, keys, values = tree.nodes, tree.keys, tree.values
    out, stack = Counter(), [(int(values[i]), (int(keys[i]),)) for i in range(len(keys)) if keys[i] >= 0]
    while stack:
        n, path = stack.pop()
        out[path] = int(nodes[n, st.CNT])
        children, c = [], nodes[n, st.CHILD]
        while c >= 0:
            children.append(int(c))
            c = nodes[c, st.SIB]
        if children:
            assert nodes[nodes[n, st.HEAD], st.CNT] == max(nodes[c, st.CNT] for c in children)
        stack += [(c, path + (int(nodes[c, st.TOK]),)) for c in children]
    return out


def _random_sequences(rng, n, alphabet, length):
    # repeats of a few phrases with noise: the shape of outputs that copy their inputs
    phrases = [[rng.randrange(alphabet) for _ in range(rng.randrange(2, 7))] for _ in range(4)]
    seqs = []
    for _ in range(n):
        s = []
        while len(s) < length:
            s += rng.choice(phrases) if rng.random() < 0.8 else [rng.randrange(alphabet)]
        seqs.append(s[:length])
    return seqs


@pytest.mark.parametrize("depth, alphabet", [(4, 5), (8, 12), (24, 300)])
def test_counts_heads_and_drafts_match_the_reference(depth, alphabet):
    rng = random.Random(depth)
    tree, ref = SuffixTree(depth, capacity=16), Reference(depth)  # a small table: growth runs too
    for seq, tokens in enumerate(_random_sequences(rng, 5, alphabet, 120)):
        i = 0
        while i < len(tokens):  # appended in uneven pieces, as steps add them
            j = i + rng.randrange(1, 9)
            tree.extend(seq, tokens[i:j])
            ref.extend(seq, tokens[i:j])
            i = j
    assert tree_counts(tree) == ref.counts
    for _ in range(300):
        context = rng.choice(list(ref.seqs.values()))[:rng.randrange(2, 120)][-depth:]
        max_tokens, factor, min_prob = rng.randrange(1, 12), rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 0.1, 0.4])
        got = tree.speculate(np.asarray(context, np.int32), max_tokens, factor, min_prob)
        want = ref.speculate(context, max_tokens, factor, min_prob)
        assert got[0] == want[0] and got[1] == pytest.approx(want[1], rel=1e-12)


def test_sequences_taken_out_leave_the_tree_of_the_rest():
    rng = random.Random(3)
    depth = 6
    seqs = _random_sequences(rng, 8, 7, 60)
    tree = SuffixTree(depth, capacity=16)
    for i, s in enumerate(seqs):
        tree.extend(i, s)
    for i in (0, 3, 5):
        tree.remove(i, seqs[i])
    rest = Reference(depth)
    for i, s in enumerate(seqs):
        if i not in (0, 3, 5):
            rest.extend(i, s)
    assert tree_counts(tree) == rest.counts
    used = int(tree.meta[0])
    tree.extend(9, seqs[0])  # freed rows are used again
    rest.extend(9, seqs[0])
    assert tree_counts(tree) == rest.counts and int(tree.meta[0]) == used
    for i in (1, 2, 4, 6, 7, 9):
        tree.remove(i, seqs[0] if i == 9 else seqs[i])
    assert tree_counts(tree) == Counter() and int(tree.nodes[0, st.CNT]) == 0


def test_the_root_hash_stays_sized_by_its_live_keys():
    """Sequences of fresh tokens put in and taken out again and again: tombstones never make the hash grow."""
    tree = SuffixTree(4, capacity=16)
    for i in range(40):
        seq = list(range(1000 * i, 1000 * i + 100))
        tree.extend(i, seq)
        tree.remove(i, seq)
    assert tree_counts(tree) == Counter() and tree.keys.shape[0] <= 512


def test_a_request_id_used_again_replaces_its_old_output():
    from types import SimpleNamespace

    from engine.spec_decode.config import SpeculativeConfig
    from engine.spec_decode.suffix import SuffixProposer
    p = SuffixProposer(SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 4}))
    first = SimpleNamespace(all_token_ids=[1, 2, 3, 7, 8, 9, 7, 8], num_prompt_tokens=3)
    p.observe("r", first)
    p.forget("r")
    again = SimpleNamespace(all_token_ids=[4, 5, 6, 11, 12], num_prompt_tokens=3)
    p.observe("r", again)
    ref = Reference(p.depth)
    ref.extend("r", [11, 12])
    assert tree_counts(p.responses) == ref.counts  # the first output is gone from the shared tree
