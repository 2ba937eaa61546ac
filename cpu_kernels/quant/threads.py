"""Threading setup for the Numba kernels: call configure_threads() before the first parallel kernel runs."""
from __future__ import annotations

import os
import time

from cpu_kernels import envs

# Kernels with less work than serial_work() bytes run on the calling thread alone. A parallel launch costs
# ~20 us on a quiet machine, where only tiny kernels should skip the pool (gemma-3-270m decode 66 tok/s at
# 256 KiB against 52 at 2 MiB); but when another process holds a core every barrier waits for a scheduler
# time slice (measured 3-6 tok/s against 38 single-threaded), so a busy machine raises the bar.
QUIET_SERIAL_WORK = 1 << 18
BUSY_SERIAL_WORK = 1 << 21
_CHECK_EVERY_S = 0.25   # how often /proc/loadavg is read
_BUSY_HOLD_S = 2.0      # busy readings keep the high bar this long (a snapshot can miss the other process)
# Busy takes 2 of the last 3 readings: one task runnable for an instant (1 reading in 45 of a decode run) had put
# every layer's GEMV on one thread for the 2 s hold, ~18 % of that run, for nothing.
_BUSY_READINGS = 2
_state = {"checked": -1.0, "busy_until": -1.0, "value": QUIET_SERIAL_WORK, "recent": 0}


def _runnable_elsewhere() -> int | None:
    """Threads of other processes runnable right now (Linux): the machine's count minus this process's."""
    try:
        with open("/proc/loadavg") as f:
            total = int(f.read().split()[3].split("/")[0])
        own = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    own += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except OSError:  # the thread ended meanwhile
                pass
        return max(0, total - own)
    except (OSError, IndexError, ValueError):
        return None


def serial_work() -> int:
    """The current threshold: RAMLM_SERIAL_WORK if set, else QUIET_ or BUSY_SERIAL_WORK by whether other
    processes' runnable threads and this process's kernel threads together want more than the cores."""
    now = time.monotonic()
    if now - _state["checked"] >= _CHECK_EVERY_S:
        _state["checked"] = now
        forced = envs.get("RAMLM_SERIAL_WORK")
        if forced is not None:
            _state["value"] = forced
            return _state["value"]
        others = _runnable_elsewhere()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        import numba
        busy = others is not None and others + numba.get_num_threads() > cores
        _state["recent"] = ((_state["recent"] << 1) | busy) & 0b111  # the last 3 readings, newest lowest
        if busy and bin(_state["recent"]).count("1") >= _BUSY_READINGS:
            _state["busy_until"] = now + _BUSY_HOLD_S
        _state["value"] = BUSY_SERIAL_WORK if now < _state["busy_until"] else QUIET_SERIAL_WORK
    return _state["value"]


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


def num_threads() -> int:
    """Numba's current thread count through the raw getter (the public one costs a few us per call)."""
    return _raw_setters()[0]()


def match_torch_threads(torch) -> None:
    """torch's intra-op thread count set to Numba's current one before a torch kernel runs (num_threads=1 must
    hold for the prefill's GEMMs and attention too); a no-op while they agree."""
    n = num_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


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
