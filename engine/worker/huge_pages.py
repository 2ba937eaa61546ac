"""Transparent huge pages for the weights only.

numpy asks the kernel for huge pages (madvise MADV_HUGEPAGE) for every array of 4 MiB or more. For the weights, read
whole at every decode step, that is worth keeping: a Q4_K 28672x4096 GEMV from DRAM ran 30-40 GB/s in huge pages
against 29-32 in 4 KiB ones. For the arrays a step allocates (a 512-token prompt's activations, 8 MB each) and for
the KV cache (touched block by block as prompts arrive) it is not: on a host whose memory is fragmented each
first-touched huge page may wait for the kernel to compact memory (calls that first touched cache pages took ~20 ms
against 0.5 later), and the first 512-token prefill of a process took 470-545 ms against 345 with the hint off
(later prefills reuse the memory either way). So the runner takes its cache from `zeros_small_pages` and runs its
steps inside `small_pages()`.
"""
from __future__ import annotations

import mmap
from contextlib import contextmanager

import numpy as np

try:  # numpy >= 2 keeps it in numpy._core, numpy 1.x in numpy.core
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:  # pragma: no cover - depends on the numpy installed
    try:
        from numpy.core.multiarray import _set_madvise_hugepage
    except ImportError:
        _set_madvise_hugepage = None


@contextmanager
def small_pages():
    """numpy arrays allocated inside get no huge-page hint; the setting before is restored on the way out."""
    if _set_madvise_hugepage is None:
        yield
        return
    before = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(before)


def huge_page_hint() -> bool:
    """Whether numpy gives new large arrays the huge-page hint now."""
    if _set_madvise_hugepage is None:
        return False
    before = _set_madvise_hugepage(False)
    _set_madvise_hugepage(before)
    return bool(before)


def zeros_small_pages(shape, dtype) -> np.ndarray:
    """A zeroed array in a mapping of its own that never gets the hint: numpy's own allocation may reuse heap
    memory that an earlier array left hinted, whatever small_pages says. Pages arrive zeroed as first touched."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    if n == 0:
        return np.zeros(shape, dtype)
    private = getattr(mmap, "MAP_PRIVATE", None)  # POSIX: private, not shared (shmem) anonymous memory
    m = mmap.mmap(-1, n) if private is None else mmap.mmap(-1, n, flags=private | mmap.MAP_ANONYMOUS)
    return np.frombuffer(m, dtype).reshape(shape)  # the array holds the mapping while it lives
