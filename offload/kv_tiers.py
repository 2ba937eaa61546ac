"""A RAM tier behind the device's KV blocks (--num-cpu-blocks): whole blocks swapped out and back in.

Block ids are the same in every layer (one block id space), so swapping block b moves b's K and V rows of
every layer: the device-KV layers' torch tensors and, in a mixed placement, the RAM layers' numpy arrays
too (their block b is handed to another request as soon as b is freed). The engine binds the tier to all
of the runner's caches (offload.apply.bind_runner). Host copies are allocated on first use (pinned on
CUDA, so the copies are DMA). The scheduler decides what moves (SchedulerOutput.blocks_to_swap_out/_in,
engine/core/kv_swap.py keeps the host ids); the engine calls swap_out/swap_in before each forward pass.
"""
from __future__ import annotations

import numpy as np


def _host_like(cache, num_blocks: int):
    """An all-zero host array of num_blocks blocks shaped like one layer's cache."""
    shape = (num_blocks, *cache.shape[1:])
    if isinstance(cache, np.ndarray):
        return np.zeros(shape, dtype=cache.dtype)
    import torch
    return torch.zeros(shape, dtype=cache.dtype, pin_memory=cache.device.type == "cuda")


def _copy_blocks(src, src_ids: list[int], dst, dst_ids: list[int]) -> None:
    """dst[dst_ids[j]] = src[src_ids[j]]; numpy to numpy or torch to torch (any devices)."""
    if isinstance(src, np.ndarray):
        dst[dst_ids] = src[src_ids]
        return
    import torch
    rows = src.index_select(0, torch.as_tensor(src_ids, device=src.device))
    # Host -> device may be asynchronous (same stream as the forward); device -> host must be finished.
    rows = rows.to(dst.device, non_blocking=dst.device.type != "cpu")
    dst.index_copy_(0, torch.as_tensor(dst_ids, device=dst.device), rows)


class HostKVTier:
    """num_blocks RAM blocks shaped like the caches of `layers` (layer index -> (k_cache, v_cache)), each a
    torch tensor on any device or a numpy array."""

    def __init__(self, num_blocks: int, layers: dict):
        self.num_blocks = int(num_blocks)
        self.layers = dict(layers)
        self._host: dict | None = None

    @property
    def allocated(self) -> bool:
        return self._host is not None

    def bind(self, layers: dict) -> None:
        """Covers these layers instead (before first use: host copies are shaped after them)."""
        if self._host is not None:
            raise RuntimeError("the RAM tier is already allocated for other layers")
        self.layers = dict(layers)

    def nbytes(self) -> int:
        total = 0
        for k, v in self.layers.values():
            per_block = k[0].nbytes if isinstance(k, np.ndarray) else k[0].numel() * k.element_size()
            total += (1 if v is k else 2) * self.num_blocks * per_block
        return total

    def _ensure(self) -> dict:
        if self._host is None:
            self._host = {}
            for i, (k, v) in self.layers.items():
                hk = _host_like(k, self.num_blocks)
                self._host[i] = (hk, hk if v is k else _host_like(v, self.num_blocks))  # V is K: one copy (MLA)
        return self._host

    def _check(self, device_ids, host_ids) -> tuple[list[int], list[int]]:
        d, h = [int(x) for x in device_ids], [int(x) for x in host_ids]
        if len(d) != len(h):
            raise ValueError(f"swap: {len(d)} device blocks but {len(h)} host blocks")
        if any(not 0 <= x < self.num_blocks for x in h):
            raise ValueError(f"swap: host block ids must lie in [0, {self.num_blocks})")
        return d, h

    def swap_out(self, device_ids, host_ids) -> None:
        """Copies device blocks device_ids[j] -> RAM blocks host_ids[j], in every layer."""
        d, h = self._check(device_ids, host_ids)
        if not d:
            return
        host = self._ensure()
        for i, (k, v) in self.layers.items():
            _copy_blocks(k, d, host[i][0], h)
            if v is not k:
                _copy_blocks(v, d, host[i][1], h)

    def swap_in(self, host_ids, device_ids) -> None:
        """Copies RAM blocks host_ids[j] -> device blocks device_ids[j], in every layer."""
        d, h = self._check(device_ids, host_ids)
        if not d:
            return
        host = self._ensure()
        for i, (k, v) in self.layers.items():
            _copy_blocks(host[i][0], h, k, d)
            if v is not k:
                _copy_blocks(host[i][1], h, v, d)
