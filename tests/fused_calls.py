"""Counts the blocks that ran as one compiled call (the real fused_block.block_step, wrapped by a counter)."""
from engine.model import fused_block


def count_fused_calls(monkeypatch) -> list[int]:
    """A one-element list holding how many block_step calls ran since (reset it by assigning [0])."""
    n = [0]
    real = fused_block.block_step

    def counted(*args):
        n[0] += 1
        return real(*args)
    monkeypatch.setattr(fused_block, "block_step", counted)
    return n
