"""Threading setup for the Numba kernels: call configure_threads() before the first parallel kernel runs."""
from __future__ import annotations

import os


def configure_threads(layer: str = "omp") -> str:
    """Pin Numba's threading layer (default OpenMP) unless NUMBA_THREADING_LAYER is already set.

    Numba silently falls back to its slow 'workqueue' layer when no runtime is found (measured
    18 us vs 134 us per small GEMV); naming the layer turns a missing libgomp into an error at the
    first parallel call instead. Also asks OpenBLAS for one thread when nothing chose otherwise,
    so its spinning pool does not fight Numba's (only effective if numpy's BLAS is not loaded yet).
    Returns the layer in effect.
    """
    chosen = os.environ.setdefault("NUMBA_THREADING_LAYER", layer)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numba

    numba.config.THREADING_LAYER = chosen
    return chosen
