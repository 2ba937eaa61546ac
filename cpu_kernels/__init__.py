"""Numba CPU kernels. Importing this package fixes the threading layer and the JIT cache folder
before any kernel module is compiled."""
from __future__ import annotations

import hashlib
import os

from cpu_kernels import envs

# omp: 18 us per parallel GEMV launch here against 134 us for workqueue; an explicit layer makes a
# missing libgomp an error rather than a silent slowdown (../shared/notes/cpu-kernels.md).
os.environ.setdefault("NUMBA_THREADING_LAYER", "omp")


def _source_digest() -> str:
    """Hash of every kernel source: Numba's cache=True keys each file by its own mtime only, so a kernel
    that inlined a helper from another file would keep stale (even crashing) machine code after an edit."""
    import numba
    h = hashlib.sha256(numba.__version__.encode())
    root = os.path.dirname(os.path.abspath(__file__))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:16]


def _cache_dir() -> str:
    """NUMBA_CACHE_DIR when the user chose one, else $RAMLM_CACHE_DIR (~/.cache/ramlm)/numba/<source digest>."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    base = envs.get("RAMLM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ramlm")
    return os.path.join(base, "numba", _source_digest())


# Numba may reload its config later (and forget this), so the folder is kept here too.
CACHE_DIR = _cache_dir()


def _set_cache_dir() -> None:
    import numba
    # Read by each @njit(cache=True) when its module is imported, so setting it here is early enough.
    numba.config.CACHE_DIR = CACHE_DIR


_set_cache_dir()


def configure_threads() -> None:
    """Called once by the engine before the first kernel runs."""
    try:
        from cpu_kernels.quant.threads import configure_threads as configure
    except ImportError:
        return
    configure()
