"""The KV cache's storage, in one place: which `kv_cache_dtype` values exist, what each stores, how many bytes a
block takes, and the share of free RAM the pool takes by default. The runner, the loader, the planner and the
GPU placement all read these (plain names and ints: no numpy or torch here)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

# kv_cache_dtype (vLLM's argument) -> the element type the cache stores (numpy and torch spell these alike).
KV_CACHE_DTYPES = {"auto": "float16", "fp16": "float16", "float16": "float16", "fp32": "float32", "float32": "float32"}
ITEMSIZE = {"float16": 2, "float32": 4}
# Without kv_cache_memory, the pool takes this share of the RAM still available after the weights.
KV_RAM_FRACTION = 0.4


def kv_storage_dtype(kv_cache_dtype: str) -> str:
    """The element type name ('float16' or 'float32') of a kv_cache_dtype; ValueError naming the supported ones."""
    try:
        return KV_CACHE_DTYPES[kv_cache_dtype]
    except (KeyError, TypeError):
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not supported; supported: "
                         f"{', '.join(KV_CACHE_DTYPES)}") from None


def kv_itemsize(kv_cache_dtype: str) -> int:
    return ITEMSIZE[kv_storage_dtype(kv_cache_dtype)]


@dataclass(frozen=True)
class LayerKV:
    """What one layer's paged cache holds per token: K rows of num_heads x head_dim and V rows of the same shape,
    or (v_is_k) no V of its own: attention reads V from the K rows (MLA's latent is both key and value), and the
    layer's cache is one array; or (shared_from >= 0) no cache of its own: the layer attends over layer
    shared_from's cache (Gemma 4's KV-shared layers), which the runner hands it, and costs no bytes."""
    num_heads: int
    head_dim: int
    v_is_k: bool = False
    shared_from: int = -1

    def block_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        return (num_blocks, block_size, self.num_heads, self.head_dim)

    @property
    def arrays(self) -> int:
        """Cache arrays of the layer: K and V, or the one K serves as both."""
        return 1 if self.v_is_k else 2

    def bytes_per_block(self, block_size: int, kv_cache_dtype: str) -> int:
        if self.shared_from >= 0:
            return 0
        return self.arrays * block_size * self.num_heads * self.head_dim * kv_itemsize(kv_cache_dtype)


def bytes_per_block_per_layer(block_size: int, num_kv_heads: int, head_dim: int, kv_cache_dtype: str,
                              v_is_k: bool = False) -> int:
    """K and V (or K alone, v_is_k) of block_size tokens in one layer."""
    return LayerKV(num_kv_heads, head_dim, v_is_k).bytes_per_block(block_size, kv_cache_dtype)


def layout_bytes_per_block(layout: Sequence[LayerKV], block_size: int, kv_cache_dtype: str) -> int:
    """One block id's cache in every layer of a layout (one LayerKV per layer)."""
    return sum(layer.bytes_per_block(block_size, kv_cache_dtype) for layer in layout)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, kv_cache_dtype: str) -> int:
    """One block id's K and V in every layer (a block id is shared by all layers)."""
    return num_layers * bytes_per_block_per_layer(block_size, num_kv_heads, head_dim, kv_cache_dtype)
