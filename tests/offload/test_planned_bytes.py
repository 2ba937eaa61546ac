"""The planner's byte counts are the bytes offload.apply puts on the device: every weight matrix of every
placed layer (tiny random models in Q4_K, placed on torch's CPU device)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.model.gguf_export import default_qtype, write_gguf
from engine.model.weights import open_weights
from offload import model_meta
from tests.model.tiny_models import tiny_model
from tests.offload.helpers import placed


@pytest.fixture(scope="module", params=["qwen3moe", "llama", "deepseek2"])
def q4k_path(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    tiny_model(request.param).save_pretrained(folder, safe_serialization=True)
    ws = open_weights(str(folder))
    path = str(folder / "q4_k.gguf")
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), dtype=np.float32) for n in ws.names()},
               default_qtype(gguf.GGMLQuantizationType.Q4_K))
    return path


def device_matrix_bytes(block) -> int:
    """Bytes of the weight matrices a device block holds (views of one stacked tensor counted once)."""
    import torch
    from gpu_kernels.linear import DeviceWeight
    storages, stack, seen = {}, [block], set()
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, DeviceWeight):
            s = o.data.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif type(o).__module__.startswith("gpu_kernels") and not isinstance(o, torch.Tensor):
            stack.extend(vars(o).values())
    return sum(storages.values())


@pytest.mark.parametrize("fmt", ["bfloat16", "packed"])
def test_planned_device_bytes_are_the_bytes_built(q4k_path, fmt):
    """Was off for MoE routers: planned at 2 bytes per value in bfloat16 while they are built in float32."""
    model, _, p, _ = placed(q4k_path, n_gpu_layers="all", gpu_weight_dtype=fmt)
    meta = model_meta(model.weights)
    assert {lp.weight_format for lp in p.layers} == {fmt}
    for lp in p.layers:
        vectors = sum(t.numel * 4 for t in meta.layer_tensors(lp.index) if not t.is_matrix)  # norms, biases
        assert lp.bytes[p.gpu_device] - vectors == device_matrix_bytes(model.blocks[lp.index]), (fmt, lp.index)
