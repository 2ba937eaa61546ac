"""keep_freed_heap: a layer's worth of activations allocated and freed again no longer faults its pages back in."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROG = """
import resource, sys
import numpy as np
sys.path.insert(0, {root!r})
from cpu_kernels.heap import keep_freed_heap

def faults_per_round():  # twenty 3 MB activations alive at once, then all freed, as a layer of a long prefill
    for _ in range(3):
        arrays = [np.ones(3 << 18, np.float32) for _ in range(20)]
        del arrays
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        arrays = [np.ones(3 << 18, np.float32) for _ in range(20)]
        del arrays
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 4

before = faults_per_round()
ok = keep_freed_heap()
print(ok, before, faults_per_round())
"""


def _run(env=None) -> tuple[str, float, float]:
    out = subprocess.run([sys.executable, "-c", PROG.format(root=ROOT)], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})}).stdout.split()
    return out[0], float(out[1]), float(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_activations_stay_in_the_heap():
    ok, before, after = _run()
    assert ok == "True"
    assert before > 5000  # 60 MB at the top of the heap handed back and faulted in again every round
    assert after < 100


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_users_own_malloc_setting_wins():
    ok, _before, _after = _run({"MALLOC_TRIM_THRESHOLD_": str(1 << 20)})
    assert ok == "False"
