"""Shared by the offload tests: tiny models on disk, device descriptions, running a runner."""
from __future__ import annotations

import json

import numpy as np

from engine.model.loader import load_model
from engine.worker.runner import ModelRunner, SeqChunk
from offload import model_meta, plan
from offload.apply import apply_plan
from offload.devices import devices_from_dict

PROMPTS = [[5, 17, 99, 3, 250, 42, 7, 8, 9, 200, 13, 77, 31], [1, 2, 3, 4, 5, 6, 7]]
NUM_BLOCKS, BLOCK_SIZE = 40, 4
CPU_ONLY = {"ram": {"total_gib": 16, "available_gib": 12}, "gpus": []}


def write_devices(tmp_path, desc: dict, name: str = "devices.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(desc))
    return str(path)


def rel_err(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def blocks_for(seq: int, per: int = 8) -> tuple[int, ...]:
    return tuple(1 + seq + 2 * i for i in range(per))  # interleaved: the block table really is followed


def placed(path: str, kv: str = "fp32", **plan_kw):
    """(model, runner, plan): the model at `path` with the plan applied on torch's CPU device."""
    model, _ = load_model(path)
    runner = ModelRunner(model, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, kv_cache_dtype=kv)
    kw = dict(gpu_device="cpu", block_size=BLOCK_SIZE, kv_cache_dtype=kv, max_model_len=32, max_num_seqs=2,
              num_gpu_blocks_override=NUM_BLOCKS, gpu_weight_dtype="float32")
    kw.update(plan_kw)
    if kw["gpu_device"] == "cpu":
        devices = devices_from_dict(CPU_ONLY)
    else:
        from offload.devices import probe_devices
        devices = probe_devices()
    p = plan(model_meta(model.weights), devices, **kw)
    placement = apply_plan(model, p, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, kv_cache_dtype=kv, runner=runner,
                           keep_originals=True)
    return model, runner, p, placement


def cpu_runner(path: str, kv: str = "fp32"):
    model, _ = load_model(path)
    return ModelRunner(model, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, kv_cache_dtype=kv)


def batched(runner, prompts=PROMPTS) -> list[np.ndarray]:
    chunks = [SeqChunk(tuple(p), 0, blocks_for(s), "all", state_slot=s + 1) for s, p in enumerate(prompts)]
    return runner.execute(chunks)


def incremental(runner, prompt=PROMPTS[0], split: int = 5) -> np.ndarray:
    """Prefill `split` tokens, then decode the rest one token per step through the cache."""
    blocks = blocks_for(0)
    rows = [runner.execute([SeqChunk(tuple(prompt[:split]), 0, blocks, "all")])[0]]
    for i in range(split, len(prompt)):
        rows.append(runner.execute([SeqChunk((prompt[i],), i, blocks, "last")])[0])
    return np.concatenate(rows)


def decode_batch(runner, prompts=PROMPTS) -> list[np.ndarray]:
    """Prefill both prompts but their last token, then decode those last tokens together in one step."""
    runner.execute([SeqChunk(tuple(p[:-1]), 0, blocks_for(s), "none", state_slot=s + 1) for s, p in enumerate(prompts)])
    return runner.execute([SeqChunk((p[-1],), len(p) - 1, blocks_for(s), "last", state_slot=s + 1)
                           for s, p in enumerate(prompts)])
