"""EngineArgs refuses values it cannot honour, naming what it supports (before anything is loaded)."""
from __future__ import annotations

import pytest

from engine.args import EngineArgs
from engine.core.kv_spec import KV_CACHE_DTYPES, bytes_per_block, kv_storage_dtype


@pytest.mark.parametrize("value", ["fp8_e4m3fn", "int4", "bf16"])
def test_unknown_kv_cache_dtype_is_refused_with_the_supported_list(value):
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp16, float16, fp32, float32, fp8, "
                                         "fp8_e4m3, fp8_e5m2, int8, q8_0"):
        EngineArgs(kv_cache_dtype=value)
    with pytest.raises(ValueError, match="supported: auto, fp16"):
        kv_storage_dtype(value)


def test_kv_block_bytes_follow_the_dtype():
    assert set(KV_CACHE_DTYPES) == {"auto", "fp16", "float16", "fp32", "float32", "fp8", "fp8_e4m3", "fp8_e5m2",
                                    "int8", "q8_0"}
    # 2 (K, V) x 3 layers x 16 tokens x 2 heads x 64 dims x 2 bytes
    assert bytes_per_block(3, 16, 2, 64, "auto") == 2 * 3 * 16 * 2 * 64 * 2
    assert bytes_per_block(3, 16, 2, 64, "fp32") == 2 * bytes_per_block(3, 16, 2, 64, "fp16")
    for fp8 in ("fp8", "fp8_e4m3", "fp8_e5m2"):  # one byte per value: half of fp16's
        assert 2 * bytes_per_block(3, 16, 2, 64, fp8) == bytes_per_block(3, 16, 2, 64, "fp16")
    for q8 in ("int8", "q8_0"):  # llama.cpp's q8_0: 34 bytes per 32 values
        assert bytes_per_block(3, 16, 2, 64, q8) == 2 * 3 * 16 * 2 * 2 * 34


def test_int8_kv_needs_head_dim_in_blocks_of_32():
    with pytest.raises(ValueError, match="int8 .q8_0. needs a head_dim divisible by 32, this model's is 80"):
        bytes_per_block(3, 16, 2, 80, "int8")
