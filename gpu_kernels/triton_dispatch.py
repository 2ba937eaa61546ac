"""Whether a GPU op runs its Triton kernel or the torch code: the one place that decides.

Triton runs for tensors on a device it compiles for (CUDA and ROCm, which torch calls "cuda", and XPU),
or on torch's CPU device under TRITON_INTERPRET=1 (the interpreter, for tests). RAMLM_TRITON=0 forces
torch everywhere. triton is imported on the first question, never at `import gpu_kernels`. If a kernel
fails to compile (a GPU this Triton does not support), that device type falls back to torch for the rest
of the process, with one warning.
"""
from __future__ import annotations

import logging
import os
from collections import Counter

from cpu_kernels import envs

logger = logging.getLogger("ramlm.gpu_kernels")
DEVICE_TYPES = ("cuda", "xpu")
calls: Counter = Counter()  # kernel name -> Triton launches, so benches and tests can tell which path ran
_importable: bool | None = None
_failed: set[str] = set()


def enabled() -> bool:
    return envs.get("RAMLM_TRITON")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0")


def importable() -> bool:
    global _importable
    if _importable is None:
        try:
            import triton  # noqa: F401
            import triton.language  # noqa: F401
            _importable = True
        except Exception as e:  # ImportError, or a broken install that fails while loading its backends
            logger.debug("triton is not usable: %s", e)
            _importable = False
    return _importable


def use_triton(device) -> bool:
    """Whether the Triton kernels run for tensors on `device` (a torch.device)."""
    if not enabled() or device.type in _failed:
        return False
    if device.type not in DEVICE_TYPES and not (device.type == "cpu" and interpreting()):
        return False
    return importable()


def run(name: str, device, triton_fn, torch_fn):
    """triton_fn() when use_triton(device), else (or when it cannot compile there) torch_fn()."""
    if use_triton(device):
        try:
            out = triton_fn()
        except Exception as e:
            # Compile or launch setup errors (an unsupported GPU); wrong answers are for the tests to catch.
            if device.type == "cpu":
                raise  # the interpreter has no unsupported hardware: this is a bug
            _failed.add(device.type)
            logger.warning("Triton kernel %s failed on %s (%s: %s); using the torch kernels from now on "
                           "(RAMLM_TRITON=0 skips Triton)", name, device, type(e).__name__, e)
        else:
            calls[name] += 1
            return out
    return torch_fn()
