"""What the scheduler hands the runner each step, and its statistics: plain frozen data, no arrays.

How the engine consumes a SchedulerOutput (block_size is the KV cache's):
  0. Before the forward pass, even when `scheduled` is empty, copy blocks_to_swap_out (device -> RAM
     tier) and blocks_to_swap_in (RAM tier -> device): a swapped-out device block may be written by
     another request in this very step. One step never has both, so their order does not matter.
     Then copy the state_copies (checkpoint -> live state slot), in order.
  1. For each entry of `scheduled`, in order, append one sequence to the batch:
         rows        token_ids (len q)
         positions   start_pos .. start_pos + q - 1
         seq_len     start_pos + q
         block table block_ids (pad with 0, the null block), and one per group_block_ids (sliding layers)
         slot        block_ids[p // block_size] * block_size + p % block_size for each position p (per group too)
         logits      the last row, only when `sample` is true (a partial prompt chunk never samples)
         states      state_slot, and the state_snapshot to save (linear-attention layers)
  2. Return {req_id: [sampled token]} for exactly the entries with sample true (with spec_token_ids: the accepted
     drafts and one token more), and pass it to Scheduler.update_from_output together with this output.
The engine keeps its per-request state itself (engine/req_state.py), so the output carries no request data.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduledRequest:
    """One sequence of this step's batch.

    req_id         the request
    token_ids      tokens to run this step (a prompt chunk, a recompute, or the last sampled token)
    start_pos      position of token_ids[0] = the request's num_computed_tokens before this step
    block_ids      the request's whole block table after this step's allocation (cache group 0's)
    sample         this step reaches the request's last known token: sample one token from its last row
    group_block_ids  the tables of cache groups 1.. (sliding-window layers; null where out of the window), or ()
    state_slot     linear-attention layers: the slot of the request's state (-1: the model has none)
    state_snapshot (rows, slot): save the state after that many of token_ids into that checkpoint slot, or ()
    spec_token_ids draft tokens (speculative decoding), the tail of token_ids: logits of every row of the entry
                   (the last sampled token's and each draft's) check them; the sampled list holds the accepted
                   drafts and one more token
    """
    req_id: str
    token_ids: tuple[int, ...]
    start_pos: int
    block_ids: tuple[int, ...]
    sample: bool
    group_block_ids: tuple[tuple[int, ...], ...] = ()
    state_slot: int = -1
    state_snapshot: tuple = ()
    spec_token_ids: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    """One step. `scheduled` is the batch order: running requests first, then newly admitted ones.

    blocks_to_swap_out (device block, host block) pairs: copy device -> RAM tier before this step runs
    blocks_to_swap_in  (device block, host block) pairs: copy RAM tier -> device before this step runs
    state_copies       (checkpoint slot, live slot) pairs: copy these states, in order, before this step runs
                       (prefix-cache hits of models with linear-attention layers)
    """
    scheduled: tuple[ScheduledRequest, ...]
    blocks_to_swap_out: tuple[tuple[int, int], ...] = ()
    blocks_to_swap_in: tuple[tuple[int, int], ...] = ()
    state_copies: tuple[tuple[int, int], ...] = ()

    @property
    def is_empty(self) -> bool:
        """Nothing to run (swaps may still be due: step 0 above)."""
        return not self.scheduled


@dataclass(frozen=True)
class SchedulerStats:
    """Engine-level figures after a step (prefix-cache counters are cumulative, in tokens)."""
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_swapped: int = 0  # requests whose KV is in the RAM tier now
    num_swap_outs: int = 0  # preemptions that swapped to the RAM tier instead of recomputing (cumulative)
    num_swap_ins: int = 0
    cpu_kv_cache_usage: float = 0.0  # fraction of RAM-tier blocks held

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
