"""A RAM tier behind the device's KV blocks (--num-cpu-blocks): whole blocks swapped out and back in.

Block ids are the same in every layer (one block id space), so swapping block b moves b's K and V rows of
every layer whose KV lives on the device. The tier is allocated on first use (pinned on CUDA, so the
copies are DMA), and nothing calls it until the KV manager does: the planner counts its bytes, apply_plan
builds it, and tests check a round trip through it.
"""
from __future__ import annotations


class HostKVTier:
    """num_blocks RAM blocks shaped like the device caches of `layers` (layer index -> (k_cache, v_cache))."""

    def __init__(self, num_blocks: int, layers: dict):
        self.num_blocks = int(num_blocks)
        self.layers = dict(layers)
        self._host: dict | None = None

    @property
    def allocated(self) -> bool:
        return self._host is not None

    def nbytes(self) -> int:
        total = 0
        for k, _ in self.layers.values():
            total += 2 * self.num_blocks * k[0].numel() * k.element_size()
        return total

    def _ensure(self) -> dict:
        if self._host is None:
            import torch
            host = {}
            for i, (k, v) in self.layers.items():
                pin = k.device.type == "cuda"
                shape = (self.num_blocks, *k.shape[1:])
                host[i] = (torch.zeros(shape, dtype=k.dtype, pin_memory=pin),
                           torch.zeros(shape, dtype=v.dtype, pin_memory=pin))
            self._host = host
        return self._host

    def _check(self, device_ids, host_ids) -> tuple[list[int], list[int]]:
        d, h = [int(x) for x in device_ids], [int(x) for x in host_ids]
        if len(d) != len(h):
            raise ValueError(f"swap: {len(d)} device blocks but {len(h)} host blocks")
        if any(not 0 <= x < self.num_blocks for x in h):
            raise ValueError(f"swap: host block ids must lie in [0, {self.num_blocks})")
        return d, h

    def swap_out(self, device_ids, host_ids) -> None:
        """Copies device blocks device_ids[j] -> RAM blocks host_ids[j], in every device-KV layer."""
        import torch
        d, h = self._check(device_ids, host_ids)
        host = self._ensure()
        for i, (k, v) in self.layers.items():
            di = torch.as_tensor(d, device=k.device)
            hi = torch.as_tensor(h)
            host[i][0].index_copy_(0, hi, k.index_select(0, di).cpu())
            host[i][1].index_copy_(0, hi, v.index_select(0, di).cpu())

    def swap_in(self, host_ids, device_ids) -> None:
        """Copies RAM blocks host_ids[j] -> device blocks device_ids[j], in every device-KV layer."""
        import torch
        d, h = self._check(device_ids, host_ids)
        host = self._ensure()
        for i, (k, v) in self.layers.items():
            di = torch.as_tensor(d, device=k.device)
            hi = torch.as_tensor(h)
            k.index_copy_(0, di, host[i][0].index_select(0, hi).to(k.device, non_blocking=True))
            v.index_copy_(0, di, host[i][1].index_select(0, hi).to(v.device, non_blocking=True))
