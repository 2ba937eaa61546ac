"""Cold JIT cache: compile on two cores at once. Numba compiles one function at a time per process (a global
lock), and a first run compiles about a minute of kernels; here a second process compiles the attention, norm,
rope and activation kernels (cpu_kernels/warmup.py) into the shared cache while this one compiles the
weight formats' repack, GEMV and dequantize kernels, and the engine's warm-up then loads the other half.

Each half leaves a marker in the cache folder when done, so warm starts spawn nothing and compile nothing.
A failed or hung helper costs nothing but time: whatever it did not compile, the engine compiles itself."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterable, Optional


HELPER_TIMEOUT_S = 600


def _marker(name: str) -> str:
    from cpu_kernels import CACHE_DIR
    return os.path.join(CACHE_DIR, f"prewarmed-{name}")


def is_done(name: str) -> bool:
    return os.path.exists(_marker(name))


def mark_done(name: str) -> None:
    path = _marker(name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w"):
        pass


def kernels_name(kv_storage: str) -> str:
    """The marker of the kernels for a KV storage (kv_spec's names: float16, float32, uint8, int8, q8_0)."""
    return f"kernels-{kv_storage}"


def start_kernel_helper(kv_storage: str) -> Optional[subprocess.Popen]:
    """Spawn `python -m cpu_kernels.warmup` for a KV storage when its kernels are not cached yet (and there is a
    second core to run it); None when there is nothing to do."""
    if is_done(kernels_name(kv_storage)) or (os.cpu_count() or 1) < 2:
        return None
    cmd = [sys.executable, "-m", "cpu_kernels.warmup", "--kv-dtype", kv_storage]
    # The folder holding cpu_kernels goes first on its path, however this process found the package.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    # One thread: the helper runs tiny shapes, and an OpenMP pool would spin on the engine's core.
    env = dict(os.environ, PYTHONPATH=path, NUMBA_NUM_THREADS="1")
    try:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return None


def compile_formats(ggml_types: Iterable) -> None:
    """Compile the kernels of these weight formats on tiny shapes (once per cache: a marker per format)."""
    from cpu_kernels.quant.registry import FORMATS
    from cpu_kernels.quant.warmup import warmup
    todo = {t for t in ggml_types if t in FORMATS and not is_done(f"format-{t.name}")}
    if todo:
        warmup(types=todo)
        for t in todo:
            mark_done(f"format-{t.name}")


def wait(helper: Optional[subprocess.Popen]) -> None:
    if helper is None:
        return
    try:
        helper.wait(timeout=HELPER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        helper.kill()
        helper.wait()


def stop(helper: Optional[subprocess.Popen]) -> None:
    """The load failed: the helper's work is not wanted now."""
    if helper is not None and helper.poll() is None:
        helper.kill()
        helper.wait()
