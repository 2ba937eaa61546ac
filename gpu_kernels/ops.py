"""torch ports of cpu_kernels' norms, rope and activations: the same math, on any torch device.

Each function follows its cpu_kernels twin operation by operation (see cpu_kernels/norms.py, rope.py,
activations.py), so these ops agree with the CPU kernels up to float32 rounding. Accumulations the CPU
kernels do in float64 are done in float64 here too, except on Apple MPS, which has no float64.

A whole layer does not agree that closely: the CPU kernels round activations to int8 per 32-block before
each quantized matmul (llama.cpp's scheme) and the GPU path multiplies float32 activations, and the model
amplifies the difference. On gemma-3-270m Q4_K_M, teacher-forced over 299 tokens of gpl-3.txt with every
layer on torch's CPU device, next-token logprobs differ from the CPU kernels' by up to 0.59 (mean 0.056,
p99 0.37; the same most likely token at 98 % of positions, mean NLL 2.60 vs 2.62), less than the CPU
kernels' default prefill differs from their batch-invariant run (up to 1.0, mean 0.068, AVX-512 VNNI host):
`python -m bench.offload_fidelity --tokens 300 --cpu-default`. tests/offload/test_fidelity.py holds it within
max 1.0 and mean 0.1 over 255 tokens.
"""
from __future__ import annotations

import numpy as np
import torch


def acc_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


# ---------------------------------------------------------------- RMSNorm
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x f32 (..., H), w f32 (H,) -> f32 (..., H): x * 1/sqrt(mean(x^2) + eps) * w, in cpu_kernels' order
    (sum of squares in float64, the mean rounded to float32, the scaling in float32)."""
    var = x.to(acc_dtype(x.device)).square().sum(-1, keepdim=True).div_(x.shape[-1]).to(torch.float32)
    r = 1.0 / torch.sqrt(var + float(np.float32(eps)))
    return (x * r) * w


# ---------------------------------------------------------------- RoPE
def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, mscale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions int64 (T,), inv_freq f32 (R/2,) -> cos, sin f32 (T, R/2), already times mscale.

    As cpu_kernels.rope: angle = float32(pos) * inv_freq in float32, cos/sin of that angle in float64
    rounded to float32, then times float32(mscale)."""
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    a = ang.to(acc_dtype(ang.device))
    m = float(np.float32(mscale))
    return torch.cos(a).to(torch.float32) * m, torch.sin(a).to(torch.float32) * m


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """x f32 (T, H, D) -> rotated copy. Rotates the first R = 2 * cos.shape[1] dims; the rest pass.

    neox: pairs (i, i + R/2) (HF rotate_half; qwen2/3, gemma3); else pairs (2i, 2i + 1) (llama on
    GGUF-permuted weights). Multiplies and the add/subtract are separate ops (no FMA), as on the CPU."""
    half = cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.clone()
    if neox:
        a, b = x[..., :half], x[..., half:2 * half]
        out[..., :half] = a * c - b * s
        out[..., half:2 * half] = b * c + a * s
    else:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = a * c - b * s
        out[..., 1:2 * half:2] = b * c + a * s
    return out


# ---------------------------------------------------------------- activations
def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up f32 (T, F) -> silu(gate) * up = gate / (1 + exp(-gate)) * up."""
    return gate / (1.0 + torch.exp(-gate)) * up


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up, written as cpu_kernels does: gate * sigmoid(2u), u = sqrt(2/pi)(g + 0.044715 g^3)."""
    u = 0.7978845608028654 * (gate + 0.044715 * (gate * gate * gate))
    return gate / (1.0 + torch.exp(-2.0 * u)) * up


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap), a new tensor."""
    return cap * torch.tanh(x / cap)


def swiglu_oai_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU, as cpu_kernels' _swiglu_oai: min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, +-7) + 1)."""
    g, u = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    return g / (1.0 + torch.exp(-1.702 * g)) * (u + 1.0)


ACTIVATIONS = {"silu": silu_mul, "gelu_tanh": gelu_tanh_mul, "swiglu_oai": swiglu_oai_mul}
