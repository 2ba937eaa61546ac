"""The Triton kernels on a machine without a GPU: interpreted on CPU tensors (triton_cases.py in a
subprocess with TRITON_INTERPRET=1), compiled for NVIDIA and AMD targets (no device needed), and the
rules that pick Triton or torch."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu_kernels import triton_dispatch

triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton): Triton kernels unchecked")
ROOT = Path(__file__).resolve().parents[2]


def test_interpreted_kernels_match_the_references():
    """TRITON_INTERPRET is read when a kernel is decorated, so it must be set before gpu_kernels.triton_*
    is imported, and it must not leak into this process (a CUDA run would interpret every kernel)."""
    env = dict(os.environ, TRITON_INTERPRET="1", RAMLM_TRITON="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
           str(ROOT / "tests/gpu_kernels/triton_cases.py")]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail and " error" not in tail, tail


# ---------------------------------------------------------------- compiled for real GPUs, without one
def _signature(fn, types: dict, constexprs: dict) -> dict:
    return {name: "constexpr" if name in constexprs else types[name] for name in fn.arg_names}


def _compile(fn, types: dict, constexprs: dict, target, **options):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    src = ASTSource(fn=fn, signature=_signature(fn, types, constexprs), constexprs=constexprs)
    return triton.compile(src, target=GPUTarget(*target), options=options)


TARGETS = {"sm90": ("cuda", 90, 32), "sm80": ("cuda", 80, 32), "gfx942": ("hip", "gfx942", 64)}


@pytest.fixture
def compiled_kernels():
    if triton_dispatch.interpreting():
        pytest.skip("TRITON_INTERPRET is set: the kernels are interpreted, not compiled")
    from gpu_kernels import triton_attention, triton_qmatmul
    return triton_qmatmul, triton_attention


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_qmatmul_compiles_for_every_format(compiled_kernels, target):
    """What the interpreter accepts the compiler may not (types, loop-carried values): compile each format,
    cycling through the compute dtypes, for GPUs this machine does not have."""
    import gguf
    from gpu_kernels.triton_dequant import FORMAT_IDS
    qm = compiled_kernels[0]
    types = dict(x_ptr="*fp32", w_ptr="*u8", out_ptr="*fp32", M="i32", N="i32", K="i32", row_bytes="i32",
                 stride_xm="i32", stride_om="i32")
    formats = sorted(FORMAT_IDS, key=lambda q: q.name)
    if target != "sm90":
        formats = [gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q8_0]
    for i, q in enumerate(formats):
        qk, size = gguf.GGML_QUANT_SIZES[q]
        cfg = qm.launch_config(1 if i % 2 else 64, qk)
        num_warps = cfg.pop("num_warps")
        k = _compile(qm._qmatmul_kernel, types, dict(FMT=FORMAT_IDS[q], QK=qk, TYPE_SIZE=size, DOT=i % 3, **cfg),
                     TARGETS[target], num_warps=num_warps, enable_fp_fusion=False)
        assert k.asm.get("cubin" if target.startswith("sm") else "hsaco"), q.name


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
@pytest.mark.parametrize("kv", ["fp16", "fp32"])
def test_paged_attention_compiles(compiled_kernels, target, kv):
    ta = compiled_kernels[1]
    types = dict(q_ptr="*fp32", k_ptr=f"*{kv}", v_ptr=f"*{kv}", out_ptr="*fp32", tables_ptr="*i64", row_seq_ptr="*i32",
                 row_pos_ptr="*i32", scale="fp32", softcap="fp32", window="i32", sinks_ptr="*fp32")
    types.update({n: "i32" for n in ta._paged_rows_kernel.arg_names if n.startswith("stride")})
    consts = dict(G=4, GP=16, D=128, DP=128, BS=16, BLOCK_L=ta.BLOCK_L, SOFTCAP=kv == "fp16", SINKS=kv == "fp32")
    k = _compile(ta._paged_rows_kernel, types, consts, TARGETS[target], num_warps=4, enable_fp_fusion=True)
    assert k.asm.get("cubin" if target.startswith("sm") else "hsaco")


# ---------------------------------------------------------------- which path runs
def test_triton_runs_on_gpus_and_under_the_interpreter_only(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("RAMLM_TRITON", raising=False)
    use = triton_dispatch.use_triton
    assert use(torch.device("cuda", 0)) and use(torch.device("xpu"))
    assert not use(torch.device("cpu")) and not use(torch.device("mps")) and not use(torch.device("meta"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use(torch.device("cpu"))
    monkeypatch.setenv("RAMLM_TRITON", "0")
    assert not use(torch.device("cpu")) and not use(torch.device("cuda", 0))


def test_a_kernel_that_cannot_compile_falls_back_to_torch_for_that_device(monkeypatch, caplog):
    monkeypatch.setattr(triton_dispatch, "_failed", set())
    monkeypatch.delenv("RAMLM_TRITON", raising=False)

    def broken():
        raise RuntimeError("no such GPU architecture")
    with caplog.at_level(logging.WARNING, logger="ramlm.gpu_kernels"):
        assert triton_dispatch.run("k", torch.device("cuda", 0), broken, lambda: "torch") == "torch"
    assert "no such GPU architecture" in caplog.text
    assert not triton_dispatch.use_triton(torch.device("cuda", 1))
    assert triton_dispatch.run("k", torch.device("cuda", 0), lambda: "triton", lambda: "torch") == "torch"
    # Under the interpreter there is no unsupported hardware: an error is a bug and is raised.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError):
        triton_dispatch.run("k", torch.device("cpu"), broken, lambda: "torch")


def test_importing_the_gpu_modules_does_not_import_triton():
    code = ("import sys\n"
            "import engine.entrypoints.llm, offload.apply, gpu_kernels.modules, gpu_kernels.linear, gpu_kernels.triton_dispatch\n"
            "assert 'triton' not in sys.modules, 'triton imported'\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
