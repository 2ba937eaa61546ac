"""The KV cache's storage, in one place: which `kv_cache_dtype` values exist, what each stores, what each layer
declares it keeps (paged blocks, LayerKV, or a per-sequence state, LayerState), how many bytes a block takes, and the
share of free RAM the pool takes by default. The runner, the loader, the planner, the RAM tier and the GPU placement
all read these (plain names and ints: no numpy or torch here)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

# kv_cache_dtype (vLLM's argument) -> the element type the cache stores (numpy and torch spell these alike).
KV_CACHE_DTYPES = {"auto": "float16", "fp16": "float16", "float16": "float16", "fp32": "float32", "float32": "float32"}
ITEMSIZE = {"float16": 2, "float32": 4}
STATE_ITEMSIZE = 4  # states are float32 (the delta rule's S accumulates over the whole sequence)
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

    @property
    def bytes_per_sequence(self) -> int:
        """Fixed bytes per sequence: none (everything is in the blocks)."""
        return 0


@dataclass(frozen=True)
class LayerState:
    """What a linear-attention layer keeps instead of paged blocks (vLLM's MambaSpec beside its attention specs): a
    fixed-size float32 state per sequence, `shapes` its arrays (qwen3.5's Gated DeltaNet: the conv inputs (K - 1, C)
    and the delta rule's S (Hv, dk, dv)). The runner holds them in pools of state slots, one pool per array."""
    shapes: tuple[tuple[int, ...], ...]
    shared_from = -1  # a state is never another layer's (LayerKV.shared_from)

    def pool_shapes(self, num_slots: int) -> tuple[tuple[int, ...], ...]:
        return tuple((num_slots, *s) for s in self.shapes)

    def bytes_per_block(self, block_size: int, kv_cache_dtype: str) -> int:
        """No paged blocks: a block id costs this layer nothing."""
        return 0

    @property
    def bytes_per_sequence(self) -> int:
        """One sequence's state (one slot of its pools)."""
        return sum(math.prod(s) for s in self.shapes) * STATE_ITEMSIZE


LayerCache = Union[LayerKV, LayerState]  # one layer's declaration (Architecture.kv_layout gives one per layer)


def is_paged(layer: LayerCache) -> bool:
    """The layer keeps paged blocks (K/V or a latent) rather than a per-sequence state."""
    return isinstance(layer, LayerKV)


def bytes_per_block_per_layer(block_size: int, num_kv_heads: int, head_dim: int, kv_cache_dtype: str,
                              v_is_k: bool = False) -> int:
    """K and V (or K alone, v_is_k) of block_size tokens in one layer."""
    return LayerKV(num_kv_heads, head_dim, v_is_k).bytes_per_block(block_size, kv_cache_dtype)


def layout_bytes_per_block(layout: Sequence[LayerCache], block_size: int, kv_cache_dtype: str) -> int:
    """One block id's cache in every layer of a layout (state layers take none)."""
    return sum(layer.bytes_per_block(block_size, kv_cache_dtype) for layer in layout)


def layout_state_bytes(layout: Sequence[LayerCache]) -> int:
    """One sequence's states in every layer of a layout (0: no linear-attention layer)."""
    return sum(layer.bytes_per_sequence for layer in layout)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, kv_cache_dtype: str) -> int:
    """One block id's K and V in every layer (a block id is shared by all layers)."""
    return num_layers * bytes_per_block_per_layer(block_size, num_kv_heads, head_dim, kv_cache_dtype)
