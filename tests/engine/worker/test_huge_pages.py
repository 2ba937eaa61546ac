"""small_pages: numpy's huge-page hint off inside, restored after; checked in the kernel's own view of the mapping."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from engine.worker.huge_pages import huge_page_hint, small_pages


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return ""
    m = re.search(r"\[(\w+)\]", text)
    return m.group(1) if m else ""


def _mapping(a: np.ndarray) -> tuple[str, bool]:
    """(perms, THPeligible) of the mapping holding a's middle byte (numpy hints from the first page boundary on),
    from /proc/self/smaps."""
    addr, perms = a.ctypes.data + a.nbytes // 2, None
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            perms = head[1] if lo <= addr < hi else None
        elif perms and head[0] == "THPeligible:":
            return perms, head[1] == "1"
    raise AssertionError("no mapping holds the array")


def _thp_eligible(a: np.ndarray) -> bool:
    return _mapping(a)[1]


def test_hint_off_inside_and_restored_after_an_error():
    before = huge_page_hint()
    with pytest.raises(RuntimeError):
        with small_pages():
            assert not huge_page_hint()
            raise RuntimeError("step failed")
    assert huge_page_hint() == before


@pytest.mark.skipif(_thp_mode() != "madvise", reason="the hint only decides eligibility in THP's madvise mode")
def test_arrays_allocated_inside_are_not_huge_page_eligible():
    # A fresh interpreter: in a long one, glibc may hand out heap memory an earlier array left hinted.
    code = textwrap.dedent("""
        import numpy as np
        from engine.worker.huge_pages import huge_page_hint, small_pages
        from tests.engine.worker.test_huge_pages import _thp_eligible
        outside = np.ones(64 << 20, np.uint8)  # numpy hints from 4 MiB on
        with small_pages():
            inside = np.ones(64 << 20, np.uint8)
        print(huge_page_hint(), _thp_eligible(outside), _thp_eligible(inside))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
    assert out.stdout.split() == ["True", "True", "False"]


@pytest.mark.skipif(_thp_mode() != "madvise", reason="the hint only decides eligibility in THP's madvise mode")
def test_engine_keeps_huge_pages_for_weights_only():
    from engine import LLM
    llm = LLM(max_model_len=256, kv_cache_memory=0.25)  # 18 layers x (K, V): 7 MB arrays, above numpy's 4 MiB
    runner = llm.llm_engine.runner
    biggest = max(runner.model.lm_head.weight.packed, key=lambda a: a.nbytes)
    assert _thp_eligible(biggest)  # the 262144-row output matrix, read whole at every step
    assert not any(_thp_eligible(a) for pair in runner.kv_caches for a in pair)
    assert all(_mapping(a)[0] == "rw-p" for pair in runner.kv_caches for a in pair)  # private, not shmem
