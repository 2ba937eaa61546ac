"""Stacked experts hand the file's pages back as their repack goes (cpu_kernels/quant/linear.stacked_experts with
GGUFFile.release over byte ranges): the process never holds a whole stacked tensor's mapped pages beside its
repacked copy, and the repack is the same."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GT

from cpu_kernels.quant import linear
from engine.model.gguf import open_gguf
from tests.model.gguf_writer_util import random_quant_bytes, write_gguf

E, N, K = 16, 512, 2048  # Q8_0: 16 experts of 1.06 MiB each


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def _file(tmp_path):
    raw = random_quant_bytes(np.random.default_rng(0), GT.Q8_0, (E, N, K))
    raw[..., 1] &= 0x3B  # every block's fp16 scale finite (no exponent of all ones)
    path = tmp_path / "experts.gguf"
    write_gguf(path, "llama", [], [("blk.0.ffn_up_exps.weight", raw, GT.Q8_0)])
    return open_gguf(path), "blk.0.ffn_up_exps.weight"


def test_ranges_cover_the_tensor_and_the_repack_is_unchanged(tmp_path, monkeypatch):
    gf, name = _file(tmp_path)
    info = gf.info(name)
    whole, _ = linear.stacked_experts(info.ggml_type, gf.raw(name), info.shape)
    monkeypatch.setattr(linear, "RELEASE_BYTES", 3 << 20)
    ranges = []
    chunked, _ = linear.stacked_experts(info.ggml_type, gf.raw(name), info.shape,
                                        lambda lo, hi: (ranges.append((lo, hi)), gf.release(name, lo, hi)))
    assert ranges[0][0] == 0 and ranges[-1][1] == info.nbytes and len(ranges) == 6  # 3 experts a range, then 1
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    for a, b in zip(whole, chunked):
        np.testing.assert_array_equal(a, b)
    again, _ = linear.stacked_experts(info.ggml_type, gf.raw(name), info.shape)  # released pages fault back in
    for a, b in zip(whole, again):
        np.testing.assert_array_equal(a, b)


def test_released_ranges_leave_rss_as_the_repack_goes(tmp_path, monkeypatch):
    gf, name = _file(tmp_path)
    info = gf.info(name)
    monkeypatch.setattr(linear, "RELEASE_BYTES", 2 << 20)
    highest = []

    def release(lo, hi):
        highest.append(_rss_file_kib())
        gf.release(name, lo, hi)
    base = _rss_file_kib()
    linear.stacked_experts(info.ggml_type, gf.raw(name), info.shape, release)
    size_kib = info.nbytes >> 10
    # At each release the mapped pages held were at most ~one range (2 MiB + a page) past the last release, never
    # the whole 17 MiB tensor; and after the last one, none of it.
    assert max(highest) - base < size_kib // 3, (base, highest, size_kib)
    assert _rss_file_kib() - base < 1024
