"""The fused decode block (engine/model/fused_block.py -> cpu_kernels/decode_block.py) gives exactly the bits of
the block's parts called one by one (logits and KV cache), and steps aside where it does not apply."""
from __future__ import annotations

import dataclasses
import threading

import gguf
import numpy as np
import pytest

from cpu_kernels.quant.threads import num_threads
from engine.model import fused_block, fused_compile
from engine.model.gguf_export import write_gguf
from engine.model.loader import load_model
from engine.model.parts.mlp import GatedMLP
from engine.model.weights import open_weights
from engine.worker.runner import ModelRunner, SeqChunk
from tests.fused_calls import count_fused_calls
from tests.model.tiny_models import tiny_model

Q = gguf.GGMLQuantizationType

# Per tensor-name part, its format; the layouts differ in how q/k/v group into stacked matmuls.
LAYOUTS = {
    "qkv stacked": {},
    "q|k stacked, v own": {"attn_q.": Q.Q4_K, "attn_k.": Q.Q4_K, "attn_v.": Q.Q8_0, "ffn_down.": Q.Q6_K},
    "q own, k|v stacked": {"attn_q.": Q.Q8_0, "attn_k.": Q.Q4_K, "attn_v.": Q.Q4_K},
    "all own": {"attn_q.": Q.Q8_0, "attn_k.": Q.Q4_K, "attn_v.": Q.Q5_0, "attn_output.": Q.Q6_K},
}


def _pick(layout):
    def pick(name, shape):
        if len(shape) < 2 or not name.endswith(".weight"):
            return Q.F32
        return next((q for part, q in layout.items() if part in name), Q.Q5_0)
    return pick


# Every layout on gemma3 (QK-norm, sliding and full layers: the attention step's richest form); the other
# families in one layout each (each model is a fused signature to compile, ~30 s on a cold cache); MoE blocks (their
# experts' multi-row steps) with the router and experts in Q5_0
PARAMS = [("gemma3", lay) for lay in LAYOUTS] + [("llama", "all own"), ("qwen3", "q own, k|v stacked"),
                                                 ("qwen3moe", "qkv stacked"), ("glm4moe", "all own")]


@pytest.fixture(scope="module", params=PARAMS,
                ids=lambda p: f"{p[0]}-{p[1]}")
def model(request, tmp_path_factory):
    arch, layout = request.param
    folder = tmp_path_factory.mktemp(arch)
    tiny_model(arch).save_pretrained(folder, safe_serialization=True)
    ws = open_weights(str(folder))
    tensors = {n: np.asarray(ws.raw(n), dtype=np.float32) for n in ws.names()}
    path = str(folder / "model.gguf")
    write_gguf(path, ws.config, tensors, _pick(LAYOUTS[layout]))
    m = load_model(path)[0]
    # Both cache dtypes over the layouts, one per model (each pair of model and dtype is a signature to compile)
    m.test_kv = "fp32" if layout == "all own" else "fp16"
    return m


@pytest.fixture(autouse=True)
def compile_at_once(monkeypatch):
    """The fused path from the first call: its signatures compile on the calling thread, not in the background."""
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "inline")


@pytest.fixture
def calls(monkeypatch):
    """How many blocks ran fused: the real block_step, counted."""
    return count_fused_calls(monkeypatch)


def _set_fused(model, on: bool, monkeypatch):
    monkeypatch.setenv("RAMLM_FUSED_BLOCKS", "1" if on else "0")
    for b in model.blocks:
        b.fused.reset()  # rebuilt at the next call under the new setting


PROMPTS = [[5, 17, 99, 3, 250, 42, 7, 8, 9, 200, 13, 77, 31], [1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5]]


def _run(model, steps):
    """Prompts prefilled together, then `steps` decode steps of every sequence; logits and caches."""
    runner = ModelRunner(model, num_blocks=80, block_size=16, kv_cache_dtype=model.test_kv)
    seqs = [list(p) for p in PROMPTS] + [[11 + i, 3] for i in range(15)]  # 18 sequences: rows past PAR_MIN_ROWS
    blocks = [(1 + 2 * s, 2 + 2 * s) for s in range(len(seqs))]
    out = runner.execute([SeqChunk(tuple(p), 0, blocks[s], "all") for s, p in enumerate(seqs)])
    pos = [len(p) for p in seqs]
    nxt = [int(np.argmax(o[-1])) for o in out]
    for step in range(steps):
        run = range(3) if step % 2 else range(len(seqs))  # alternate 3-row and 18-row steps
        out = runner.execute([SeqChunk((nxt[s],), pos[s], blocks[s], "last") for s in run])
        for s, o in zip(run, out):
            pos[s], nxt[s] = pos[s] + 1, int(np.argmax(o[-1]))
    return out, runner.kv_caches


def test_fused_block_is_bitwise_the_parts(model, calls, monkeypatch):
    _set_fused(model, False, monkeypatch)
    plain, plain_kv = _run(model, 4)
    assert calls[0] == 0
    _set_fused(model, True, monkeypatch)
    before = num_threads()
    fused, fused_kv = _run(model, 4)
    assert calls[0] >= 4 * len(model.blocks)  # the decode steps and the short prompt chunks ran fused
    assert num_threads() == before
    for a, b in zip(plain, fused):
        np.testing.assert_array_equal(a, b)
    for (k0, v0), (k1, v1) in zip(plain_kv, fused_kv):
        np.testing.assert_array_equal(k0, k1)
        np.testing.assert_array_equal(v0, v1)


def test_fused_block_on_one_thread_when_every_kernel_is_small(model, calls, monkeypatch):
    """A busy machine's bar (here forced) puts every kernel on one thread; bits and thread count unchanged."""
    _set_fused(model, False, monkeypatch)
    plain, _ = _run(model, 2)
    _set_fused(model, True, monkeypatch)
    monkeypatch.setenv("RAMLM_SERIAL_WORK", str(1 << 40))
    monkeypatch.setitem(fused_block.serial_work.__globals__["_state"], "checked", -1.0)
    before = num_threads()
    fused, _ = _run(model, 2)
    monkeypatch.setitem(fused_block.serial_work.__globals__["_state"], "checked", -1.0)
    assert calls[0] > 0 and num_threads() == before
    for a, b in zip(plain, fused):
        np.testing.assert_array_equal(a, b)


def test_long_prefill_chunk_runs_the_parts(model, calls, monkeypatch):
    """A chunk longer than GEMV_MAX_M takes the dense prefill path: the fused block steps aside."""
    _set_fused(model, True, monkeypatch)
    runner = ModelRunner(model, num_blocks=20, block_size=16, kv_cache_dtype=model.test_kv)
    runner.execute([SeqChunk(tuple(range(1, 41)), 0, (1, 2, 3), "last")])
    assert calls[0] == 0
    runner.execute([SeqChunk((7,), 40, (1, 2, 3), "last")])
    assert calls[0] == len(model.blocks)


def test_a_replaced_part_turns_the_fused_block_off(model, calls, monkeypatch):
    """The offload layer may swap a part after load: the block then runs its parts, with the new one."""
    _set_fused(model, True, monkeypatch)
    block = model.blocks[0]
    runner = ModelRunner(model, num_blocks=20, block_size=16, kv_cache_dtype=model.test_kv)
    runner.execute([SeqChunk((1, 2, 3), 0, (1,), "last")])
    n = calls[0]
    assert n == len(model.blocks)
    attn = block.parts[0]
    replacement = attn.o.__class__.__new__(attn.o.__class__)
    replacement.__dict__.update(attn.o.__dict__)
    monkeypatch.setattr(attn, "o", replacement)
    runner.execute([SeqChunk((4,), 3, (1,), "last")])
    assert calls[0] == n + len(model.blocks) - 1
    assert block.fused.args is False


def test_an_error_inside_restores_the_thread_count(model, monkeypatch):
    _set_fused(model, True, monkeypatch)
    runner = ModelRunner(model, num_blocks=4, block_size=16, kv_cache_dtype=model.test_kv)
    runner.execute([SeqChunk((1, 2), 0, (1,), "last")])
    before = num_threads()
    meta = runner.build_batch([SeqChunk((3,), 2, (1,), "last")])
    bad = dataclasses.replace(meta, slot_mapping=np.array([10 ** 6], np.int64))
    x = model.embed_tokens(bad.input_ids)
    with pytest.raises(ValueError):
        model.blocks[0](x, bad, runner.kv_caches[0])
    assert num_threads() == before


def test_a_new_signature_compiles_in_the_background(model, calls, monkeypatch, tmp_path):
    """Uncached (no marker): the steps run the parts until block_step has compiled in the background."""
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "background")
    monkeypatch.setattr(fused_compile, "CACHE_DIR", str(tmp_path))  # no markers here
    monkeypatch.setattr(fused_compile, "_state", {})
    monkeypatch.setattr(fused_compile, "_wanted", {})
    _set_fused(model, True, monkeypatch)
    runner = ModelRunner(model, num_blocks=4, block_size=16, kv_cache_dtype=model.test_kv)
    runner.execute([SeqChunk((1, 2), 0, (1,), "last")])
    assert calls[0] == 0 and fused_compile.pending()  # noted, not compiling: the engine starts it after a token
    runner.execute([SeqChunk((3,), 2, (1,), "last")])
    assert calls[0] == 0
    fused_compile.start_pending()
    fused_compile.wait()
    assert not fused_compile.pending()
    runner.execute([SeqChunk((4,), 3, (1,), "last")])
    assert calls[0] == len(model.blocks)
    assert any(p.name.startswith("fused-block-") for p in tmp_path.iterdir())


def test_cached_mode_compiles_nothing_and_runs_cached_signatures(model, calls, monkeypatch, tmp_path):
    """RAMLM_FUSED_COMPILE=cached: an uncached signature runs kernel by kernel with nothing noted to compile; once
    a marker says it is cached (another process compiled it), a fresh process state runs it fused."""
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "cached")
    monkeypatch.setattr(fused_compile, "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fused_compile, "_state", {})
    monkeypatch.setattr(fused_compile, "_wanted", {})
    _set_fused(model, True, monkeypatch)
    runner = ModelRunner(model, num_blocks=4, block_size=16, kv_cache_dtype=model.test_kv)
    runner.execute([SeqChunk((1, 2), 0, (1,), "last")])
    runner.execute([SeqChunk((3,), 2, (1,), "last")])
    assert calls[0] == 0 and not fused_compile.pending() and not list(tmp_path.iterdir())
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "inline")  # as the other process did
    runner.execute([SeqChunk((4,), 3, (1,), "last")])
    assert calls[0] == len(model.blocks) and list(tmp_path.iterdir())
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "cached")
    monkeypatch.setattr(fused_compile, "_state", {})
    for b in model.blocks:
        b.fused.reset()
    runner.execute([SeqChunk((5,), 4, (1,), "last")])
    assert calls[0] == 2 * len(model.blocks)


def test_an_inline_engine_joins_a_compile_an_earlier_engine_started(model, calls, monkeypatch, tmp_path):
    """A background compile under way (an earlier engine's) and an engine that compiles in line: its first step runs
    fused (it ran every block kernel by kernel while the other thread compiled, a flaky count under load)."""
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "background")
    monkeypatch.setattr(fused_compile, "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fused_compile, "_state", {})
    monkeypatch.setattr(fused_compile, "_wanted", {})
    _set_fused(model, True, monkeypatch)
    gate, real = threading.Event(), fused_compile._compile
    monkeypatch.setattr(fused_compile, "_compile", lambda key, sig: (gate.wait(), real(key, sig)))
    runner = ModelRunner(model, num_blocks=4, block_size=16, kv_cache_dtype=model.test_kv)
    runner.execute([SeqChunk((1, 2), 0, (1,), "last")])
    fused_compile.start_pending()
    assert "compiling" in fused_compile._state.values()
    threading.Timer(0.5, gate.set).start()  # the earlier engine's compile ends while the next step waits for it
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "inline")
    runner.execute([SeqChunk((3,), 2, (1,), "last")])
    assert calls[0] == len(model.blocks)


def test_long_chunk_through_the_scratch_buffer_gives_the_same_logits(model, monkeypatch):
    """Every layer's stacked gate|up output in the one scratch buffer: the same bits as fresh arrays."""
    from engine.model.parts import linear as layers

    def logits():
        runner = ModelRunner(model, num_blocks=20, block_size=16, kv_cache_dtype=model.test_kv)
        return runner.execute([SeqChunk(tuple(range(1, 41)), 0, (1, 2, 3), "all")])[0]

    fresh = logits()
    used = []
    real = layers.big_scratch
    monkeypatch.setattr(layers, "BIG_BYTES", 1 << 10)
    monkeypatch.setattr(layers, "big_scratch", lambda shape: used.append(real(shape)) or used[-1])
    np.testing.assert_array_equal(logits(), fresh)
    # dense MLPs and MoE shared experts stack gate|up (routed experts stack nothing)
    mlps = sum(isinstance(p, GatedMLP) or getattr(p, "shared", None) is not None for b in model.blocks for p in b.parts)
    assert len(used) == mlps and all(u is not None for u in used)


def test_big_stacked_outputs_reuse_one_scratch_buffer(monkeypatch):
    """Stacked gate|up outputs above BIG_BYTES land in one per-thread buffer (no fresh mapping per layer); small
    and very large ones are fresh arrays."""
    from engine.model.parts import linear as layers
    monkeypatch.setattr(layers, "BIG_BYTES", 1 << 10)
    monkeypatch.setattr(layers, "KEEP_BYTES", 1 << 20)
    a = layers.big_scratch((64, 16))
    b = layers.big_scratch((32, 32))
    assert a.shape == (64, 16) and b.shape == (32, 32) and np.shares_memory(a, b)
    assert layers.big_scratch((8, 16)) is None  # 512 bytes: glibc's heap reuses it anyway
    assert layers.big_scratch((1024, 512)) is None  # 2 MiB: above KEEP_BYTES
