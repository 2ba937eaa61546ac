"""vLLM's dtype reaches the GPU layers: float32 and bfloat16 fix their compute type, auto keeps the GPU's own."""
from __future__ import annotations

import pytest

from offload import plan
from offload.devices import devices_from_dict
from offload.meta import synthetic_meta

TURING = {"ram": {"total_gib": 64, "available_gib": 60},  # sm75: no bfloat16
          "gpus": [{"name": "cuda:0", "kind": "cuda", "total_gib": 24, "free_gib": 23, "compute_capability": "7.5"}]}
AMPERE = {**TURING, "gpus": [{**TURING["gpus"][0], "compute_capability": "8.6"}]}


@pytest.mark.parametrize("desc,dtype,want", [(AMPERE, "auto", "bfloat16"), (TURING, "auto", "float16"),
                                             (AMPERE, "float32", "float32"), (AMPERE, "float", "float32"),
                                             (TURING, "float32", "float32"), (AMPERE, "bfloat16", "bfloat16")])
def test_dtype_sets_the_gpu_compute_type(desc, dtype, want):
    p = plan(synthetic_meta("llama-8b"), devices_from_dict(desc), n_gpu_layers="4", dtype=dtype, max_model_len=4096)
    assert p.compute_dtype == want


def test_impossible_dtypes_are_refused():
    meta = synthetic_meta("llama-8b")
    with pytest.raises(ValueError, match="no bfloat16 support"):
        plan(meta, devices_from_dict(TURING), n_gpu_layers="4", dtype="bfloat16", max_model_len=4096)
    with pytest.raises(ValueError, match="conflicts with gpu_weight_dtype"):
        plan(meta, devices_from_dict(AMPERE), n_gpu_layers="4", dtype="float32", gpu_weight_dtype="bfloat16",
             max_model_len=4096)
