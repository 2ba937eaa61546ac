"""The near-tie rule of the batching tests (issue 3): two runs must agree on greedy tokens up to the
first position where the reference run had a near tie (top-2 logprobs within 0.1)."""
from __future__ import annotations

NEAR_TIE = 0.1


def near_tie_cut(out) -> int:
    """Number of leading tokens that must match: up to and excluding the first near tie."""
    for i, entry in enumerate(out.outputs[0].logprobs):
        lps = sorted((lp.logprob for lp in entry.values()), reverse=True)
        if len(lps) > 1 and lps[0] - lps[1] <= NEAR_TIE:
            return i
    return len(out.outputs[0].token_ids)


def assert_same_up_to_near_ties(ref_outs, outs):
    for ref, got in zip(ref_outs, outs):
        n = near_tie_cut(ref)
        assert got.outputs[0].token_ids[:n] == ref.outputs[0].token_ids[:n], (ref.prompt, n)
