"""The single-thread switch and the busy-machine threshold of the Numba kernels."""
import os
import subprocess
import sys
import time

import numba
import pytest

from cpu_kernels.quant import threads


def _fresh_state(monkeypatch):
    monkeypatch.setitem(threads._state, "checked", -1.0)
    monkeypatch.setitem(threads._state, "busy_until", -1.0)
    monkeypatch.setitem(threads._state, "recent", 0)


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


def test_one_busy_reading_is_not_enough(monkeypatch):
    """A task runnable for an instant must not put the kernels on one thread for the hold: 2 of 3 readings do."""
    monkeypatch.delenv("RAMLM_SERIAL_WORK", raising=False)
    _fresh_state(monkeypatch)
    readings = iter([0, 9, 0, 0, 9, 9])  # others runnable per reading: 9 is more than any core count here
    monkeypatch.setattr(threads, "_runnable_elsewhere", lambda: next(readings))

    def read():
        monkeypatch.setitem(threads._state, "checked", -1.0)
        return threads.serial_work()
    assert [read() for _ in range(4)] == [threads.QUIET_SERIAL_WORK] * 4  # the lone busy reading is ignored
    assert read() == threads.QUIET_SERIAL_WORK  # one of the last three
    assert read() == threads.BUSY_SERIAL_WORK  # two of the last three
    assert threads._state["busy_until"] > time.monotonic()


def test_env_forces_the_threshold(monkeypatch):
    _fresh_state(monkeypatch)
    monkeypatch.setenv("RAMLM_SERIAL_WORK", "12345")
    assert threads.serial_work() == 12345


def test_torch_follows_numbas_thread_count():
    """The dense prefill path's torch calls run on as many threads as the Numba kernels (num_threads=1 holds)."""
    import numba
    import torch

    from cpu_kernels.quant.threads import match_torch_threads
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: no thread count to follow")
    before_numba, before_torch = numba.get_num_threads(), torch.get_num_threads()
    try:
        numba.set_num_threads(1)
        match_torch_threads(torch)
        assert torch.get_num_threads() == 1
        numba.set_num_threads(2)
        match_torch_threads(torch)
        assert torch.get_num_threads() == 2
    finally:
        numba.set_num_threads(before_numba)
        torch.set_num_threads(before_torch)
