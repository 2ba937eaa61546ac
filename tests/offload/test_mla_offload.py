"""MLA layers on torch's CPU device (gpu_kernels/mla.py) beside tests/offload/test_apply.py's walk: one layer exact
given the Numba kernels' int8 activations, and the latent cache held once in the RAM tier."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.model.gguf_export import default_qtype, write_gguf
from engine.model.loader import load_model
from engine.model.weights import open_weights
from engine.worker.batch import RowGroups
from gpu_kernels.mla import DeviceMLA
from tests.model.tiny_models import tiny_model
from tests.offload.helpers import BLOCK_SIZE, NUM_BLOCKS, PROMPTS, blocks_for, placed, rel_err


@pytest.fixture(scope="module")
def q8_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mla")
    tiny_model("deepseek2").save_pretrained(folder, safe_serialization=True)
    ws = open_weights(str(folder))
    path = str(folder / "q8_0.gguf")
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()},
               default_qtype(gguf.GGMLQuantizationType.Q8_0))
    return path


def test_one_mla_layer_is_exact_given_the_same_int8_activations(q8_path, monkeypatch):
    """Layer 0 (MLA + dense MLP) on both paths from the same input: float32 summation order is what is left, and a
    row whose activation sits on an int8 rounding boundary may move by one step."""
    from cpu_kernels.quant.linear import q8_roundtrip
    from engine.worker.runner import ModelRunner, SeqChunk
    from gpu_kernels import linear as gl
    monkeypatch.setenv("RAMLM_FUSED_BLOCKS", "0")
    cpu, _ = load_model(q8_path)
    dev, runner, _, _ = placed(q8_path, n_gpu_layers="all", gpu_weight_dtype="packed")
    assert isinstance(dev.blocks[0].parts[0], DeviceMLA)
    matmul = gl.DeviceWeight.matmul

    def rounded(self, x):
        if self.ggml_type.name not in ("F32", "F16", "BF16"):
            x = torch.from_numpy(q8_roundtrip(x.numpy()))
        return matmul(self, x)
    monkeypatch.setattr(gl.DeviceWeight, "matmul", rounded)
    meta = runner.build_batch([SeqChunk(tuple(p), 0, blocks_for(s), "all") for s, p in enumerate(PROMPTS)])
    import dataclasses
    meta = dataclasses.replace(meta, rows=RowGroups(meta.query_start_loc, "float32"))
    x = cpu.embed_tokens(meta.input_ids)
    cpu_runner = ModelRunner(cpu, NUM_BLOCKS, BLOCK_SIZE, "fp32")
    want = cpu.blocks[0](x, meta, cpu_runner.kv_caches[0])
    got = dev.blocks[0](x, meta, runner.kv_caches[0])
    errs = [rel_err(g, w) for g, w in zip(got, want)]
    assert float(np.median(errs)) < 1e-5 and max(errs) < 5e-2, errs


def test_the_ram_tier_holds_the_latent_cache_once(q8_path):
    _, runner, p, placement = placed(q8_path, kv="fp16", n_gpu_layers="all", num_cpu_blocks=8)
    tier = placement.kv_tier
    for k, v in runner.kv_caches:
        assert isinstance(k, torch.Tensor) and k is v and tuple(k.shape) == (NUM_BLOCKS, BLOCK_SIZE, 1, 272)
    tier.swap_out([1, 2], [0, 1])
    assert tier.nbytes() == 3 * 8 * BLOCK_SIZE * 272 * 2  # layers x blocks x one fp16 row of 272 per token
    assert all(h[0] is h[1] for h in tier._host.values())
    assert p.kv.bytes_per_block_per_layer == BLOCK_SIZE * 272 * 2  # fp16, one array: not K and V
