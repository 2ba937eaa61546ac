"""glibc's heap kept between layers: a long prefill step allocates and frees tens of MB of activations per layer, and
by default glibc hands a freed heap top above ~2x its largest recent mapping back to the kernel, so each layer
faults those pages in again (a fault and a zeroed page per 4 KB). keep_freed_heap() raises that line once per
process; the user's own MALLOC_TRIM_THRESHOLD_ / MALLOC_MMAP_THRESHOLD_ win."""
from __future__ import annotations

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit: larger blocks are mappings of their own (see big_scratch)
TRIM_THRESHOLD = 256 << 20  # freed top of the heap kept up to this much (the peak is what a step needed anyway)


@functools.cache
def keep_freed_heap() -> bool:
    """Sets glibc's trim and mmap thresholds (fixed, so glibc no longer moves them). True where they were set."""
    if not sys.platform.startswith("linux") or "MALLOC_TRIM_THRESHOLD_" in os.environ \
            or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
