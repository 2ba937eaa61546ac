"""Threading setup for the Numba kernels: call configure_threads() before the first parallel kernel runs."""
from __future__ import annotations

import os

# Kernels with less work than this (bytes touched) run on the calling thread alone: a parallel launch costs
# ~20 us on a quiet machine, and when another process holds a core the barrier waits for a scheduler time
# slice (measured: gemma-3-270m decode 5.9 tok/s on 2 busy cores against 37.5 on 1 thread).
SERIAL_WORK = 1 << 21


class serial_if:
    """`with serial_if(small):` runs the block's Numba kernels on one thread when `small`. A class rather
    than contextlib (a decode step enters ~100 of these) calling Numba's raw thread-count setters (the public
    ones relaunch-check the pool under a lock: 6 us against 1.6 us a round trip)."""

    __slots__ = ("small", "prev")

    def __init__(self, small: bool):
        self.small = small

    def __enter__(self):
        if self.small:
            get, put = _raw_setters()
            self.prev = get()
            put(1)

    def __exit__(self, *exc):
        if self.small:
            _raw_setters()[1](self.prev)
        return False


_RAW = None


def _raw_setters():
    global _RAW
    if _RAW is None:
        import numba
        from numba.np.ufunc import parallel
        numba.get_num_threads()  # launches the pool once, as the public setter would
        raw = (getattr(parallel, "_get_num_threads", None), getattr(parallel, "_set_num_threads", None))
        _RAW = raw if all(raw) else (numba.get_num_threads, numba.set_num_threads)
    return _RAW


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
