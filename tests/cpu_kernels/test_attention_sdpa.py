"""Long prefill chunks through torch's bf16 SDPA (attention_sdpa): rows against the dense reference over cached
prefixes and sliding windows, the other rows bitwise paged_attention's, and which hosts and layers take it."""
from __future__ import annotations

import numpy as np
import pytest

from cpu_kernels import attention_sdpa as S
from cpu_kernels.quant.simd import AMX, HOST_FEATURES, _amx_permitted
from tests.cpu_kernels.test_attention import make_batch, reference, run

# decode, a chunk after a cached prefix, a fresh prompt, a long chunk after a prefix, a one-token prompt
SEQS = [(37, 1), (50, 13), (20, 20), (75, 40), (1, 1)]


@pytest.mark.parametrize("cache_dtype", [np.float16, np.float32], ids=["f16", "f32"])
@pytest.mark.parametrize("block_size", [16, 7])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 1), (3, 3)], ids=["gqa8:2", "mqa4:1", "mha"])
@pytest.mark.parametrize("window", [0, 5, 17, 40])
def test_long_rows_match_dense_and_the_rest_stay_paged(cache_dtype, block_size, hq, hkv, window):
    d = 40
    b = make_batch(SEQS, hq, hkv, d, block_size, cache_dtype, seed=block_size + hq + window)
    scale = 2.0 / np.sqrt(d)
    flags = np.array([0, 1, 1, 1, 0], np.uint8)
    out = S.mixed_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale,
                            window, flags)
    ref = reference(b, scale, window)
    assert out.shape == b.q.shape and out.dtype == np.float32
    rows = np.zeros(len(out), bool)
    for s in np.flatnonzero(flags):
        rows[b.query_start_loc[s]:b.query_start_loc[s + 1]] = True
    # bf16 inputs and outputs: about 2^-9 relative each; the outputs are averages of N(0, 1) values
    np.testing.assert_allclose(out[rows], ref[rows], rtol=0, atol=4e-2)
    assert np.abs(out[rows] - ref[rows]).max() > 1e-4  # the flagged rows did take the bf16 path
    assert np.array_equal(out[~rows], run(b, scale, window)[~rows])  # the others: paged_attention's bits


def test_sequence_attention_rejects_rows_past_the_context():
    b = make_batch([(10, 10)], 4, 1, 16, 16, np.float16)
    with pytest.raises(ValueError, match="does not fit"):
        S.sequence_attention(b.q, b.k_cache, b.v_cache, 5, b.block_tables[0], 1.0)


def test_enabled_on_amx_hosts_unless_told(monkeypatch):
    monkeypatch.delenv("RAMLM_SDPA_PREFILL", raising=False)
    assert S.enabled() == AMX
    for v, want in (("0", False), ("1", True)):
        monkeypatch.setenv("RAMLM_SDPA_PREFILL", v)
        assert S.enabled() is want


@pytest.fixture(scope="module", params=["gemma3", "llama"])
def tiny(request, tmp_path_factory):
    """A tiny random HF model (gemma3: a 5-token sliding window; llama: 4 heads on 2 kv heads) and its folder."""
    from tests.model.tiny_models import tiny_model
    model = tiny_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, safe_serialization=True)
    return model, str(path)


def test_amx_needs_the_cpu_and_the_kernels_permission():
    if "amx-bf16" not in HOST_FEATURES:
        assert not AMX and not S.enabled()  # no AMX paths where the CPU lacks it, whatever the kernel says
        return
    import ctypes
    import torch
    x = torch.randn(64, 64).bfloat16()
    torch.mm(x, x)  # oneDNN has asked for the tiles where the kernel supports them
    perm = ctypes.c_uint64(0)
    ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(perm))  # ARCH_GET_XCOMP_PERM: what this process holds
    assert bool(perm.value >> 18 & 1) == AMX == _amx_permitted()


def test_sequence_attention_rejects_a_short_block_table():
    b = make_batch([(40, 40)], 4, 1, 16, 16, np.float16)
    with pytest.raises(ValueError, match="block table"):
        S.sequence_attention(b.q, b.k_cache, b.v_cache, 40, b.block_tables[0][:2], 1.0)


@pytest.mark.parametrize("sdpa", ["0", "1"])
def test_long_chunks_match_transformers_either_way(tiny, monkeypatch, sdpa):
    """bf16 prefill of a fresh 48-token prompt beside a short one, and of a 40-token chunk after a 40-token
    cached prefix, against HF transformers; RAMLM_SDPA_PREFILL picks SDPA or paged_attention's bf16 rows. The
    layers' gate|up outputs share layers.big_scratch's buffer."""
    from engine.model.loader import load_model
    from engine.worker.runner import ModelRunner, SeqChunk
    from tests.cpu_kernels.test_attention_bf16 import HAS_BF16_DOT
    from tests.model.tiny_models import hf_logits
    if not HAS_BF16_DOT:
        pytest.skip("no native bf16: long chunks stay float32")
    from engine.model.parts import linear as layers
    monkeypatch.setenv("RAMLM_SDPA_PREFILL", sdpa)
    monkeypatch.setattr(layers, "BIG_BYTES", 1 << 10)  # every layer's gate|up output in the one scratch buffer
    calls = []
    real = S.mixed_attention
    monkeypatch.setattr(S, "mixed_attention", lambda *a: calls.append(1) or real(*a))
    hf, path = tiny
    model, _ = load_model(path)
    model.prefill_dtype = "bfloat16"
    rng = np.random.default_rng(5)
    long, short = [int(t) for t in rng.integers(1, 256, 80)], [5, 17, 99, 3]

    def close(got, ids):
        ref = hf_logits(hf, ids).numpy()[-len(got):]
        assert np.abs(got - ref).max() / np.abs(ref).max() < 5e-2

    runner = ModelRunner(model, num_blocks=32, block_size=16, kv_cache_dtype="fp16")
    a, b = runner.execute([SeqChunk(tuple(long[:48]), 0, (3, 1, 7), "all"), SeqChunk(tuple(short), 0, (9,), "all")])
    close(a, long[:48])
    close(b, short)
    runner.execute([SeqChunk(tuple(long[:40]), 0, (4, 2, 8, 6, 10), "none")])
    close(runner.execute([SeqChunk(tuple(long[40:]), 40, (4, 2, 8, 6, 10), "all")])[0], long)
    assert bool(calls) == (sdpa == "1")
