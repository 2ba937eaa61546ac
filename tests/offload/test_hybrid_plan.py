"""Hybrid models (qwen3.5) in the planner and `ramlm info`: KV blocks only for the attention layers, and the
linear-attention layers' state pools (slots x float32 conv + recurrent states) counted where their layers live."""
from __future__ import annotations

from engine.core.kv_spec import LayerKV
from engine.model.info import model_info
from offload import plan
from offload.devices import devices_from_dict
from offload.meta import synthetic_meta
from tests.model.tiny_models import tiny_model

GPU = {"ram": {"total_gib": 128, "available_gib": 120},
       "gpus": [{"name": "cuda:0", "kind": "cuda", "description": "test", "total_gib": 80, "free_gib": 80}]}
STATE_27B = (3 * (2 * 16 * 128 + 48 * 128) + 48 * 128 * 128) * 4  # conv (K-1, C) + S (Hv, dk, dv), float32


def test_synthetic_meta_counts_states_not_kv_in_linear_layers():
    m = synthetic_meta("qwen3.5-27b")
    assert [i for i in range(64) if m.has_kv(i)] == list(range(3, 64, 4))
    assert m.state_bytes_of(0) == STATE_27B and m.state_bytes_of(3) == 0
    assert m.kv == LayerKV(4, 256)  # the attention layers' K and V, counted for those layers only
    assert next(t for t in m.tensors if t.name == "blk.0.ssm_conv1d.weight").ggml_type == "F32"


def test_plan_counts_kv_of_attention_layers_and_state_pools():
    m = synthetic_meta("qwen3.5-27b")
    kw = dict(block_size=16, kv_cache_dtype="fp16", max_model_len=8192, max_num_seqs=4, num_gpu_blocks_override=100)
    per_block = 2 * 16 * 4 * 256 * 2
    cpu = plan(m, devices_from_dict(GPU), **kw)
    ram = next(u for u in cpu.usage if u.device == "cpu")
    assert cpu.kv.layers_by_device == {"cpu": 16}
    assert ram.kv == 100 * per_block * 16 + 5 * 48 * STATE_27B  # max_num_seqs + 1 slots
    gpu = plan(m, devices_from_dict(GPU), n_gpu_layers="all", num_state_slots=9, **kw)
    dev = next(u for u in gpu.usage if u.device == "cuda:0")
    assert gpu.kv.layers_by_device == {"cuda:0": 16} and dev.kv == 100 * per_block * 16 + 9 * 48 * STATE_27B
    assert any(r.startswith("states: 9 slots") for r in gpu.reasons)


def test_info_reports_state_bytes(tmp_path):
    tiny_model("qwen35").save_pretrained(tmp_path, safe_serialization=True)
    info = model_info(str(tmp_path))
    assert info["kv_bytes_per_1k_tokens"] == 2 * 1 * 2 * 64 * 2 * 1024  # K and V, fp16, the one attention layer
    assert info["state_bytes_per_sequence"] == 3 * (3 * 512 + 4 * 64 * 64) * 4
