"""Rotary position embeddings: inverse frequencies for each scaling type, and the in-place rotation.

rope_inv_freq follows transformers' modeling_rope_utils step by step in float32 (numpy 2 keeps Python
scalars weak, as torch does), so inv_freq agrees with HF's to about 1 ulp (the float32 pow may differ).
apply_rope computes angle = float32(pos) * inv_freq in float32 as HF does, then cos/sin of that float32
angle in float64 rounded to float32 (within 1 ulp of torch's), and rotates without FMA contraction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

_PAR_MIN_ROWS = 8


@dataclass(frozen=True)
class RopeScaling:
    """How RoPE frequencies are scaled; type is 'none', 'linear', 'llama3' or 'yarn'."""
    type: str = "none"
    factor: float = 1.0
    original_max_position: int = 0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attn_factor: float = 1.0  # mscale multiplier; yarn's own mscale is computed from factor
    truncate: bool = True  # yarn: correction range floored/ceiled (HF's default, llama.cpp's); gpt-oss: False


def _base_inv_freq(dim: int, theta: float) -> np.ndarray:
    # HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)); the pow rounded once from float64.
    expo = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
    pos_freqs = (np.float64(theta) ** expo.astype(np.float64)).astype(np.float32)
    return pos_freqs


def _yarn_mscale(factor: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> tuple[np.ndarray, float]:
    """Inverse frequencies and the cos/sin multiplier (HF's attention_scaling) for one RoPE base.

    Args:
        head_dim: rotated dimensions D (the rotary dim when only part of a head rotates).
        theta: RoPE base.
        scaling: type 'none' | 'linear' (inv_freq / factor) | 'llama3' | 'yarn', as HF computes them.
    Returns:
        (inv_freq f32 (D/2,), mscale). mscale is scaling.attn_factor for every type, times yarn's own
        0.1 ln(factor) + 1 for yarn (HF's attention_factor replaces the latter: pass it divided by it).
    """
    dim = int(head_dim)
    kind = (scaling.type or "none").lower()
    pos_freqs = _base_inv_freq(dim, theta)
    mscale = float(scaling.attn_factor)
    if kind in ("none", "default"):
        return (1.0 / pos_freqs).astype(np.float32), mscale
    if kind == "linear":
        inv_freq = 1.0 / pos_freqs
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32), mscale
    if kind in ("llama3", "yarn") and scaling.original_max_position <= 0:
        raise ValueError(f"rope scaling {kind!r} needs original_max_position > 0")
    if kind == "llama3":
        return _llama3(1.0 / pos_freqs, scaling), mscale
    if kind == "yarn":
        return _yarn(pos_freqs, dim, theta, scaling), mscale * _yarn_mscale(scaling.factor)
    raise ValueError(f"unsupported rope scaling type {scaling.type!r} (none, linear, llama3, yarn)")


def _llama3(inv_freq: np.ndarray, sc: RopeScaling) -> np.ndarray:
    # transformers _compute_llama3_parameters, same operations in float32
    factor, low, high = sc.factor, sc.low_freq_factor, sc.high_freq_factor
    old_context_len = sc.original_max_position
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama).astype(np.float32)


def _yarn(pos_freqs: np.ndarray, dim: int, base: float, sc: RopeScaling) -> np.ndarray:
    # transformers _compute_yarn_parameters (rope_parameters' truncate), same operations in float32
    factor = sc.factor
    beta_fast = sc.beta_fast or 32
    beta_slow = sc.beta_slow or 1
    orig = sc.original_max_position

    def correction_dim(num_rotations):
        return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if sc.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevent singularity
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    inv_freq = (inv_freq_interpolation * (1 - extrapolation_factor)
                + inv_freq_extrapolation * extrapolation_factor)
    return inv_freq.astype(np.float32)


@njit(cache=True, error_model="numpy")
def _cos_sin_rows(positions, inv_freq, mscale32, cos, sin, t0, t1):
    for t in range(t0, t1):
        pos = np.float32(positions[t])
        for i in range(inv_freq.shape[0]):
            ang = np.float64(pos * inv_freq[i])  # the float32 product, as HF
            cos[t, i] = np.float32(np.cos(ang)) * mscale32
            sin[t, i] = np.float32(np.sin(ang)) * mscale32


@njit(cache=True, error_model="numpy", parallel=True)
def _cos_sin_par(positions, inv_freq, mscale32, cos, sin):
    T = positions.shape[0]
    nchunks = min(T, 64)
    for c in prange(nchunks):
        _cos_sin_rows(positions, inv_freq, mscale32, cos, sin, c * T // nchunks, (c + 1) * T // nchunks)


@njit(cache=True, error_model="numpy")
def rope_cos_sin(positions, inv_freq, mscale):
    """cos and sin f32 (T, R/2) of angle = float32(pos) * inv_freq, times mscale: one step's table, shared by every
    layer with this RoPE base (the float64 cos/sin cost far more than the rotation itself)."""
    T, half = positions.shape[0], inv_freq.shape[0]
    cos = np.empty((T, half), np.float32)
    sin = np.empty((T, half), np.float32)
    if T >= _PAR_MIN_ROWS:
        _cos_sin_par(positions, inv_freq, np.float32(mscale), cos, sin)
    else:
        _cos_sin_rows(positions, inv_freq, np.float32(mscale), cos, sin, 0, T)
    return cos, sin


@njit(cache=True, error_model="numpy")
def _rotate_head(xr, cr, sr, neox):
    """One head's vector xr (D,) by one row's table cr, sr (R/2,): the code every rotation here runs."""
    half = cr.shape[0]  # rotates the first 2 * half dims (partial rotary); the rest pass through
    if neox:  # pairs (i, i + half): HF rotate_half
        for i in range(half):
            a = xr[i]
            b = xr[i + half]
            xr[i] = a * cr[i] - b * sr[i]
            xr[i + half] = b * cr[i] + a * sr[i]
    else:  # pairs (2i, 2i + 1): GPT-J / llama.cpp "normal"
        for i in range(half):
            a = xr[2 * i]
            b = xr[2 * i + 1]
            xr[2 * i] = a * cr[i] - b * sr[i]
            xr[2 * i + 1] = b * cr[i] + a * sr[i]


@njit(cache=True, error_model="numpy")
def _rotate_rows(x, cos, sin, neox, t0, t1):
    for t in range(t0, t1):
        for h in range(x.shape[1]):
            _rotate_head(x[t, h], cos[t], sin[t], neox)


@njit(cache=True, error_model="numpy", parallel=True)
def _rotate_par(x, cos, sin, neox):
    T = x.shape[0]
    nchunks = min(T, 64)
    for c in prange(nchunks):
        _rotate_rows(x, cos, sin, neox, c * T // nchunks, (c + 1) * T // nchunks)


@njit(cache=True, error_model="numpy")
def rotate(x, cos, sin, neox):
    """Rotates x f32 (T, H, D) in place by a rope_cos_sin table (T, R/2), R <= D; neox as apply_rope."""
    if x.shape[0] != cos.shape[0] or 2 * cos.shape[1] > x.shape[2]:
        raise ValueError("rotate: the cos/sin table does not match x")
    if x.shape[0] >= _PAR_MIN_ROWS:
        _rotate_par(x, cos, sin, neox)
    else:
        _rotate_rows(x, cos, sin, neox, 0, x.shape[0])


@njit(cache=True, error_model="numpy")
def apply_rope(x, positions, inv_freq, mscale, neox):
    """Rotates x in place.

    Args:
        x: f32 (T, H, D), modified in place. positions: int64 (T,). inv_freq: f32 (R/2,) with R <= D
        (R < D: only the first R dims rotate). mscale: cos/sin multiplier. neox: True pairs (i, i + R/2)
        (HF rotate_half; qwen2/3, gemma3), False pairs (2i, 2i + 1) (llama on GGUF-permuted weights).
    """
    cos, sin = rope_cos_sin(positions, inv_freq, mscale)
    rotate(x, cos, sin, neox)
