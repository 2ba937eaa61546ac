"""The KV cache's storage, in one place: which `kv_cache_dtype` values exist, what each stores, what each layer
declares it keeps (paged blocks, LayerKV, or a per-sequence state, LayerState), how many bytes a block takes, and the
share of free RAM the pool takes by default. The runner, the loader, the planner, the RAM tier and the GPU placement
all read these (plain names and ints: no numpy or torch here)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

# kv_cache_dtype (vLLM's argument) -> the storage the cache keeps (numpy and torch spell the element types alike). The
# fp8 formats store their bytes, e4m3fn as uint8 and e5m2 as int8 (cpu_kernels/f16.py converts each by its array
# type); "fp8" is e4m3, as in vLLM, with unit scales (values past the format's range saturate). int8 (llama.cpp's
# --cache-type q8_0) stores each row of head_dim values as llama.cpp's q8_0 blocks: per 32 values an f16 scale
# (amax / 127) and 32 int8, 34 bytes, in uint8 arrays with one more axis (cpu_kernels/kv_rows.py).
KV_CACHE_DTYPES = {"auto": "float16", "fp16": "float16", "float16": "float16", "fp32": "float32", "float32": "float32",
                   "fp8": "uint8", "fp8_e4m3": "uint8", "fp8_e5m2": "int8", "int8": "q8_0", "q8_0": "q8_0"}
ITEMSIZE = {"float16": 2, "float32": 4, "uint8": 1, "int8": 1}
Q8_BLOCK, Q8_BYTES = 32, 34  # q8_0: values per block, bytes per block (f16 scale + 32 int8)
STATE_ITEMSIZE = 4  # states are float32 (the delta rule's S accumulates over the whole sequence)
# Without kv_cache_memory, the pool takes this share of the RAM still available after the weights.
KV_RAM_FRACTION = 0.4


def kv_storage_dtype(kv_cache_dtype: str) -> str:
    """The element type name ('float16', 'float32', or fp8 bytes 'uint8' / 'int8') of a kv_cache_dtype; ValueError
    naming the supported ones."""
    try:
        return KV_CACHE_DTYPES[kv_cache_dtype]
    except (KeyError, TypeError):
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not supported; supported: "
                         f"{', '.join(KV_CACHE_DTYPES)}") from None


def storage_array_dtype(storage: str) -> str:
    """The numpy/torch element type of a storage's arrays (q8_0 blocks are bytes)."""
    return "uint8" if storage == "q8_0" else storage


def row_shape(head_dim: int, storage: str) -> tuple[int, ...]:
    """One cached row's (a token's values for one kv head) trailing array axes: (head_dim,), or q8_0's
    (head_dim / 32, 34) blocks; ValueError for a head_dim q8_0 cannot block."""
    if storage != "q8_0":
        return (head_dim,)
    if head_dim % Q8_BLOCK:
        raise ValueError(f"kv_cache_dtype int8 (q8_0) needs a head_dim divisible by {Q8_BLOCK}, this model's is "
                         f"{head_dim}: use kv_cache_dtype fp8 or auto")
    return (head_dim // Q8_BLOCK, Q8_BYTES)


def row_bytes(head_dim: int, kv_cache_dtype: str) -> int:
    """Bytes of one cached row of head_dim values."""
    storage = kv_storage_dtype(kv_cache_dtype)
    return math.prod(row_shape(head_dim, storage)) * ITEMSIZE[storage_array_dtype(storage)]


@dataclass(frozen=True)
class LayerKV:
    """What one layer's paged cache holds per token: K rows of num_heads x head_dim and V rows of the same shape,
    or (v_is_k) no V of its own: attention reads V from the K rows (MLA's latent is both key and value), and the
    layer's cache is one array; or (shared_from >= 0) no cache of its own: the layer attends over layer
    shared_from's cache (Gemma 4's KV-shared layers), which the runner hands it, and costs no bytes. window > 0: a
    sliding-window layer, which needs only the last `window` tokens' rows (its cache group frees the blocks that fall
    out of it: cache_groups)."""
    num_heads: int
    head_dim: int
    v_is_k: bool = False
    shared_from: int = -1
    window: int = 0

    def block_shape(self, num_blocks: int, block_size: int, kv_cache_dtype: str = "auto") -> tuple[int, ...]:
        """The layer's K (or V) array: (num_blocks, block_size, num_heads) and row_shape's axes."""
        return (num_blocks, block_size, self.num_heads, *row_shape(self.head_dim, kv_storage_dtype(kv_cache_dtype)))

    @property
    def arrays(self) -> int:
        """Cache arrays of the layer: K and V, or the one K serves as both."""
        return 1 if self.v_is_k else 2

    def bytes_per_block(self, block_size: int, kv_cache_dtype: str) -> int:
        if self.shared_from >= 0:
            return 0
        return self.arrays * block_size * self.num_heads * row_bytes(self.head_dim, kv_cache_dtype)

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


@dataclass(frozen=True)
class CacheGroup:
    """Layers whose caches share one block id space and one block table per request: every layer of one sliding
    window (0 = full attention). A sliding group's request holds only the blocks that still meet its window."""
    window: int
    layers: tuple[int, ...]


def cache_groups(layout: Sequence[LayerCache]) -> tuple[CacheGroup, ...]:
    """The layout's paged layers grouped by window: full attention first, then windows ascending (group 0's table is
    Request.block_ids). A model without sliding layers has one group, as before groups existed; state layers
    (LayerState) hold no blocks and belong to none."""
    paged = [(i, layer) for i, layer in enumerate(layout) if is_paged(layer)]
    windows = sorted({layer.window for _, layer in paged}) or [0]
    return tuple(CacheGroup(w, tuple(i for i, layer in paged if layer.window == w)) for w in windows)


def layer_groups(layout: Sequence[LayerCache]) -> tuple[int, ...]:
    """Each layer's group index in cache_groups(layout) (0 for a state layer, which reads no block table)."""
    out = [0] * len(layout)
    for g, group in enumerate(cache_groups(layout)):
        for i in group.layers:
            out[i] = g
    return tuple(out)


def group_bytes_per_block(layout: Sequence[LayerCache], group: CacheGroup, block_size: int, kv_cache_dtype: str) -> int:
    """One block id of the group: its layers' caches."""
    return layout_bytes_per_block([layout[i] for i in group.layers], block_size, kv_cache_dtype)


def sliding_blocks_per_seq(window: int, block_size: int, max_step_tokens: int, max_model_len: int) -> int:
    """Most blocks one request holds in a sliding group: the window before a step's first token and the step's
    tokens (never more than its whole context), plus one for a window that straddles a block boundary."""
    tokens = min(window - 1 + max_step_tokens, max_model_len)
    return -(-tokens // block_size) + 1


def sliding_pool_blocks(window: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                        max_model_len: int) -> int:
    """A sliding group's pool (null block included): what max_num_seqs requests hold at once, plus one window of
    blocks each for the prefix cache (a hit needs only the window before its end: freed blocks stay findable)."""
    per_seq = sliding_blocks_per_seq(window, block_size, max_num_batched_tokens, max_model_len)
    return max_num_seqs * (per_seq + -(-window // block_size)) + 1


def group_counts(layout: Sequence[LayerKV], num_blocks: int, block_size: int, max_model_len: int, max_num_seqs: int,
                 max_num_batched_tokens: int) -> tuple[int, ...]:
    """Blocks per cache group when the full groups keep num_blocks and each sliding group takes what it can use
    (sliding_pool_blocks) up to that: the planner's count, where a GPU's room bounds every group."""
    return tuple(min(num_blocks, sliding_pool_blocks(g.window, block_size, max_num_seqs, max_num_batched_tokens,
                                                     max_model_len)) if g.window else num_blocks
                 for g in cache_groups(layout))


def split_pool(layout: Sequence[LayerKV], num_blocks: int, block_size: int, kv_cache_dtype: str, max_model_len: int,
               max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """Blocks per cache group (null block included) for the bytes of `num_blocks` blocks in every layer.

    A sliding group gets what max_num_seqs requests can hold at once and a window each for the prefix cache
    (sliding_pool_blocks) but never more than num_blocks; the full groups
    share the rest evenly in blocks, never more than max_num_seqs contexts of max_model_len: so no group has fewer
    blocks than one pool of num_blocks for every layer gave it."""
    groups = cache_groups(layout)
    if len(groups) == 1:
        return (num_blocks,)
    useful = max_num_seqs * -(-max_model_len // block_size) + 1
    sizes = {g.window: group_bytes_per_block(layout, g, block_size, kv_cache_dtype) for g in groups}
    budget = num_blocks * sum(sizes.values())
    counts = {}
    for g in groups:
        if g.window:
            counts[g.window] = min(num_blocks, sliding_pool_blocks(g.window, block_size, max_num_seqs,
                                                                   max_num_batched_tokens, max_model_len))
            budget -= counts[g.window] * sizes[g.window]
    full_bytes = sum(sizes[g.window] for g in groups if not g.window)
    if full_bytes:
        counts[0] = min(budget // full_bytes, max(useful, num_blocks))
    return tuple(int(counts[g.window]) for g in groups)
