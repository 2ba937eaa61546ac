"""The single-thread switch and the busy-machine threshold of the Numba kernels."""
import os
import subprocess
import sys
import time

import numba

from cpu_kernels.quant import threads


def _fresh_state(monkeypatch):
    monkeypatch.setitem(threads._state, "checked", -1.0)
    monkeypatch.setitem(threads._state, "busy_until", -1.0)


def test_serial_if_runs_one_thread_and_restores():
    before = numba.get_num_threads()
    with threads.serial_if(True):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before
    with threads.serial_if(False):
        assert numba.get_num_threads() == before


def test_busy_machine_raises_the_threshold(monkeypatch):
    """Spinning processes beyond the cores make serial_work() pick the busy bar (and hold it)."""
    monkeypatch.delenv("RAMLM_SERIAL_WORK", raising=False)
    _fresh_state(monkeypatch)
    cores = len(os.sched_getaffinity(0))
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores + 2)]
    try:
        seen = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and threads.BUSY_SERIAL_WORK not in seen:
            monkeypatch.setitem(threads._state, "checked", -1.0)
            seen.add(threads.serial_work())
            time.sleep(0.05)
        assert threads.BUSY_SERIAL_WORK in seen
        assert threads._state["busy_until"] > time.monotonic()  # held for a while after the reading
    finally:
        for p in spin:
            p.kill()
            p.wait()


def test_env_forces_the_threshold(monkeypatch):
    _fresh_state(monkeypatch)
    monkeypatch.setenv("RAMLM_SERIAL_WORK", "12345")
    assert threads.serial_work() == 12345
