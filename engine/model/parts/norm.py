"""RMSNorm, LayerNorm (BERT's, with a bias) and a block's residual step (x + post(y), then the next norm) in one
kernel."""
from __future__ import annotations

import numpy as np

from cpu_kernels import layer_norm, norms
from cpu_kernels.quant.threads import serial_if, serial_work
from engine.model.parts.linear import vector


def small_on_one_thread(a: np.ndarray) -> serial_if:
    """Runs an elementwise kernel over a on the calling thread when a is small: the kernels' own row
    thresholds launch the pool for a 16-row decode step, and each launch waits for a time slice while
    another process is busy (a served 16-row step spent 19 % of its time in RMSNorm's barriers)."""
    return serial_if(a.nbytes < serial_work())


class RMSNorm:
    def __init__(self, ws, name: str, eps: float):
        self.weight = np.array(vector(ws, name))  # writable: one kernel signature for file and converted weights
        self.eps = float(eps)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        # Per-head norm (QK-norm) of (T, H, D): normalize over the last axis, as (T * H, D) rows.
        x2 = x if x.ndim == 2 else np.ascontiguousarray(x).reshape(-1, x.shape[-1])
        if x2.shape[0] < norms.PAR_MIN_ROWS:  # rms_norm runs serially anyway: no thread switch to enter
            y = norms.rms_norm(x2, self.weight, self.eps)
        else:
            with small_on_one_thread(x2):
                y = norms.rms_norm(x2, self.weight, self.eps)
        return y if x.ndim == 2 else y.reshape(x.shape)

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """norm(x + y): a post-norm residual step."""
        return add_and_norm(x, y, None, self)[1]


class LayerNorm:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (name: the .weight tensor; .bias beside it)."""

    def __init__(self, ws, name: str, eps: float):
        self.weight = np.array(vector(ws, name))
        self.bias = np.array(vector(ws, name[:-len("weight")] + "bias"))
        self.eps = float(eps)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x2 = np.ascontiguousarray(x, dtype=np.float32)
        with small_on_one_thread(x2):
            return layer_norm.layer_norm(x2, self.weight, self.bias, self.eps)

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """LayerNorm(x + y) in one kernel: a post-norm residual step."""
        x, y = np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.float32)
        with small_on_one_thread(x):
            return layer_norm.residual_layer_norm(x, y, self.weight, self.bias, self.eps)


NORMS = {"rms": RMSNorm, "layer": LayerNorm}


def make_norm(kind: str, ws, name: str | None, eps: float):
    """The norm of BlockSpec.norm's kind over tensor `name` (its .weight), or None where name is None."""
    return NORMS[kind](ws, name + ".weight", eps) if name else None


NO_NORM = np.empty(0, np.float32)


def norm_args(n: RMSNorm | None) -> tuple[np.ndarray, float]:
    """(weight, eps) as the kernels take them: an empty weight where there is no norm."""
    return (n.weight, float(n.eps)) if n is not None else (NO_NORM, 0.0)


def add_and_norm(x: np.ndarray, y: np.ndarray, post: RMSNorm | None, nxt: RMSNorm | None):
    """(x + post(y), nxt(x + post(y))) in one kernel (post None: x + y; nxt None: the second is empty): a block's
    residual step without a launch and a Python call per part; the bits of the parts called one by one."""
    x, y = np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.float32)
    (pw, pe), (nw, ne) = norm_args(post), norm_args(nxt)
    if x.shape[0] < norms.PAR_MIN_ROWS:
        return norms.residual_rms_norm(x, y, pw, nw, pe, ne)
    with small_on_one_thread(x):
        return norms.residual_rms_norm(x, y, pw, nw, pe, ne)
