"""Every registered architecture through the three paths derived from its one BlockSpec: the CPU modules kernel by
kernel (against HF transformers), the fused decode step (bitwise the kernels), and the torch twins on torch's CPU
device (the GPU path). A new architecture without a tiny model here, or a part without one of the three faces,
fails this file."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.model import fused_compile
import engine.model.archs  # noqa: F401 (registers every architecture)
from engine.model.gguf_export import default_qtype, write_gguf
from engine.model.loader import load_model
from engine.model.parts import PART_CLASSES
from engine.model.parts.base import Part
from engine.model.registry import ARCHITECTURES
from engine.model.weights import open_weights
from engine.worker.runner import ModelRunner, SeqChunk
from gpu_kernels.modules import DeviceBlock
from tests.fused_calls import count_fused_calls
from tests.model.tiny_models import ARCHES, ENCODERS, POOLING_ONLY, arch_of, hf_logits, tiny_model
from tests.offload.helpers import placed

Q = gguf.GGMLQuantizationType
PROMPT = [5, 17, 99, 3, 250, 42, 7, 8, 9, 200, 13, 77, 31]
SPLIT = 6  # prefill PROMPT[:SPLIT], then decode the rest one token per step


def test_every_architecture_has_a_tiny_model():
    assert sorted(ARCHITECTURES) == sorted({arch_of(a) for a in ARCHES + ENCODERS + POOLING_ONLY})


@pytest.mark.parametrize("cls", sorted(set(PART_CLASSES.values()), key=lambda c: c.__name__))
def test_every_part_has_all_three_faces(cls):
    for face in ("__call__", "fused", "to_device"):
        assert getattr(cls, face) is not getattr(Part, face), f"{cls.__name__} lacks {face}"


@pytest.fixture(scope="module", params=sorted(ARCHES))
def tiny(request, tmp_path_factory):
    """(arch, fp32 HF folder, Q8_0 GGUF of the same weights, HF logits of PROMPT)."""
    arch = request.param
    hf = tiny_model(arch)
    folder = tmp_path_factory.mktemp(arch)
    hf.save_pretrained(folder, safe_serialization=True)
    ws = open_weights(str(folder))
    tensors = {n: np.asarray(ws.raw(n), dtype=np.float32) for n in ws.names()}
    path = str(folder / "q8_0.gguf")
    write_gguf(path, ws.config, tensors, default_qtype(Q.Q8_0))
    return arch, str(folder), path, hf_logits(hf, PROMPT).numpy()


def _decode(runner) -> np.ndarray:
    blocks = (1, 3, 5, 7)
    rows = [runner.execute([SeqChunk(tuple(PROMPT[:SPLIT]), 0, blocks, "all")])[0]]
    for i in range(SPLIT, len(PROMPT)):
        rows.append(runner.execute([SeqChunk((PROMPT[i],), i, blocks, "last")])[0])
    return np.concatenate(rows)


def _kernels(path, monkeypatch, fused: bool):
    monkeypatch.setenv("RAMLM_FUSED_BLOCKS", "1" if fused else "0")
    model, _ = load_model(path)
    return model, _decode(ModelRunner(model, num_blocks=12, block_size=4, kv_cache_dtype="fp32"))


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_kernel_by_kernel_matches_transformers(tiny, monkeypatch):
    arch, folder, _, ref = tiny
    _, got = _kernels(folder, monkeypatch, fused=False)
    assert _rel(got, ref) < 2e-3, arch


FLOAT_FUSED_ARCH = "qwen3moe"  # float32 weights, stacked experts too, run fused in one family (each model compiles)


@pytest.mark.parametrize("which", ["hf", "gguf"])
def test_fused_decode_is_bitwise_the_kernels(tiny, monkeypatch, which):
    arch, folder, path, _ = tiny
    if which == "hf" and arch != FLOAT_FUSED_ARCH:
        pytest.skip(f"float32 weights run fused on {FLOAT_FUSED_ARCH}: GEMVs and expert slices are the only calls a "
                    "format picks")
    src = folder if which == "hf" else path
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "inline")
    model, plain = _kernels(src, monkeypatch, fused=False)
    calls = count_fused_calls(monkeypatch)
    model, fused = _kernels(src, monkeypatch, fused=True)
    steps = len(PROMPT) - SPLIT + 1  # the short prefill chunk and every decode step
    assert calls[0] == steps * len(model.blocks), f"{arch}: a block did not run fused"
    np.testing.assert_array_equal(fused, plain)


def test_torch_twins_match_the_kernels(tiny, monkeypatch):
    arch, folder, _, _ = tiny
    _, plain = _kernels(folder, monkeypatch, fused=False)
    model, runner, plan, _ = placed(folder, n_gpu_layers="all")
    assert all(isinstance(b, DeviceBlock) for b in model.blocks) and plan.gpu_layers()
    assert _rel(_decode(runner), plain) < 1e-4, arch
