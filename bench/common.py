"""Shared by bench scripts: machine facts, git revision, JSON results in bench/results/."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def machine() -> dict:
    import numba
    import numpy
    info = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "isa": isa(),
            "python": platform.python_version(), "numpy": numpy.__version__, "numba": numba.__version__,
            "threading_layer": os.environ.get("NUMBA_THREADING_LAYER")}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def isa() -> str:
    """The instruction set that sets the kernels' speed here: a Zen 4 and a Zen 3 host differ several-fold, and
    AMX hosts run long prefill chunks on bf16 tiles (avx512-amx)."""
    from cpu_kernels.quant import simd
    if simd.HAS_VNNI:
        return "avx512-amx" if simd.AMX else "avx512-vnni"
    return "avx2" if simd.HAS_AVX2 else "generic"


def git_revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__), timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_result(name: str, figures: dict, extra: dict | None = None, path: str | None = None) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = path or os.path.join(RESULTS, f"{name}-{stamp}.json")
    with open(path, "w") as f:
        json.dump({"bench": name, "time": stamp, "git": git_revision(), "machine": machine(),
                   "figures": figures, **(extra or {})}, f, indent=1)
    return path


def median(xs) -> float:
    return float(statistics.median(xs))
