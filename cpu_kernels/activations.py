"""Elementwise kernels: gated activations, logit softcap, and a vectorizable float32 exp.

Every kernel uses error_model="numpy": Python's ZeroDivisionError check on each division stops LLVM
from vectorizing the loop. Numba has no vector math library here (no SVML), so np.exp / np.tanh are one
libm call per element; exp_f32 below is plain float32 arithmetic that LLVM vectorizes inside loops
(Cody-Waite reduction + cephes' degree-6 polynomial, within 2 ulp on [-87, 88]): 1 us for 2048 values
against 8 us for libm's expf.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

# Elementwise work below this many elements runs on one thread: a parallel launch costs ~5-10 us.
_PAR_MIN_ELEMS = 1 << 15
_CHUNK = 4096

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_F2 = np.float32(2.0)
_HALF = np.float32(0.5)
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_EXP_MAX = np.float32(88.3762626647949)   # ~ln(FLT_MAX)
_EXP_MIN = np.float32(-87.3365447504)     # ln(2^-126): results stay normal (smaller ones are clamped)
_P0 = np.float32(1.9875691500e-4)
_P1 = np.float32(1.3981999507e-3)
_P2 = np.float32(8.3334519073e-3)
_P3 = np.float32(4.1665795894e-2)
_P4 = np.float32(1.6666665459e-1)
_P5 = np.float32(5.0000001201e-1)
# tanh for |x| < 0.625 (cephes tanhf)
_T0 = np.float32(-5.70498872745e-3)
_T1 = np.float32(2.06390887954e-2)
_T2 = np.float32(-5.37397155531e-2)
_T3 = np.float32(1.33314422036e-1)
_T4 = np.float32(-3.33332819422e-1)
_TANH_SMALL = np.float32(0.625)
_TANH_BIG = np.float32(20.0)  # tanh is 1.0f beyond ~9
# gelu tanh approximation: sqrt(2/pi) and 0.044715, as torch's gelu(approximate='tanh')
_GELU_BETA = np.float32(0.7978845608028654)
_GELU_KAPPA = np.float32(0.044715)
# gpt-oss's clamped SwiGLU (transformers' GptOssExperts: alpha 1.702, limit 7.0)
_OAI_ALPHA = np.float32(1.702)
_OAI_LIMIT = np.float32(7.0)


@intrinsic
def bits_to_f32(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as a float32."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif v.type.width < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())
    return types.float32(bits), codegen


@intrinsic
def f32_to_bits(typingctx, x):
    """Reinterpret a float32 as uint32."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(x), codegen


@njit(cache=True, error_model="numpy")
def exp_f32(x):
    """exp(x) for float32 x; vectorizes in loops. Inputs below ln(2^-126) return ~1.2e-38, not 0."""
    x = _EXP_MIN if x < _EXP_MIN else x  # written so that NaN passes through (min/max would drop it)
    x = _EXP_MAX if x > _EXP_MAX else x
    n = np.floor(x * _LOG2E + _HALF)
    r = x - n * _LN2_HI
    r = r - n * _LN2_LO
    p = _P0 * r + _P1
    p = p * r + _P2
    p = p * r + _P3
    p = p * r + _P4
    p = p * r + _P5
    p = p * (r * r) + r + _F1
    return p * bits_to_f32((np.int32(n) + np.int32(127)) << np.int32(23))


@njit(cache=True, error_model="numpy")
def tanh_f32(x):
    """tanh(x) for float32 x, branch-free so that loops vectorize."""
    ax = x if x >= _F0 else -x  # abs() on float32 blocks vectorization here
    z = x * x
    small = _T0 * z + _T1
    small = small * z + _T2
    small = small * z + _T3
    small = small * z + _T4
    small = small * z * x + x
    e = exp_f32(_F2 * (_TANH_BIG if ax > _TANH_BIG else ax))
    big = _F1 - _F2 / (e + _F1)
    big = big if x >= _F0 else -big
    return small if ax < _TANH_SMALL else big


@njit(cache=True, error_model="numpy")
def _silu_mul_rows(a, ga, b, ub, out, t0, t1, f0, f1):
    for t in range(t0, t1):
        # Row slices of C arrays: indices from range(len) need no negative-index wraparound, which kept LLVM
        # from vectorizing (4x slower); gate is a[:, ga:ga + F], up b[:, ub:ub + F].
        gr, ur, orow = a[t, ga + f0:ga + f1], b[t, ub + f0:ub + f1], out[t, f0:f1]
        for f in range(orow.shape[0]):
            g = gr[f]
            orow[f] = g / (_F1 + exp_f32(-g)) * ur[f]


@njit(cache=True, error_model="numpy")
def _gelu_tanh_mul_rows(a, ga, b, ub, out, t0, t1, f0, f1):
    # 0.5 x (1 + tanh(u)) == x * sigmoid(2u): the same function without tanh's cancellation near -1.
    for t in range(t0, t1):
        gr, ur, orow = a[t, ga + f0:ga + f1], b[t, ub + f0:ub + f1], out[t, f0:f1]  # see _silu_mul_rows
        for f in range(orow.shape[0]):
            g = gr[f]
            u = _GELU_BETA * (g + _GELU_KAPPA * (g * g * g))
            orow[f] = g / (_F1 + exp_f32(-_F2 * u)) * ur[f]


@njit(cache=True, error_model="numpy")
def _swiglu_oai_rows(a, ga, b, ub, out, t0, t1, f0, f1):
    # gpt-oss's clamped SwiGLU: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1).
    for t in range(t0, t1):
        gr, ur, orow = a[t, ga + f0:ga + f1], b[t, ub + f0:ub + f1], out[t, f0:f1]  # see _silu_mul_rows
        for f in range(orow.shape[0]):
            g = min(gr[f], _OAI_LIMIT)
            u = min(max(ur[f], -_OAI_LIMIT), _OAI_LIMIT)
            orow[f] = g / (_F1 + exp_f32(-_OAI_ALPHA * g)) * (u + _F1)


@njit(cache=True, error_model="numpy", parallel=True)
def _swiglu_oai_par(a, ga, b, ub, out):
    T, F = out.shape
    nc = (F + _CHUNK - 1) // _CHUNK
    for i in prange(T * nc):
        t, c = i // nc, i % nc
        _swiglu_oai_rows(a, ga, b, ub, out, t, t + 1, c * _CHUNK, min(F, (c + 1) * _CHUNK))


@njit(cache=True, error_model="numpy")
def _swiglu_oai(a, ga, b, ub, F):
    T = a.shape[0]
    out = np.empty((T, F), np.float32)
    if T * F >= _PAR_MIN_ELEMS:
        _swiglu_oai_par(a, ga, b, ub, out)
    else:
        _swiglu_oai_rows(a, ga, b, ub, out, 0, T, 0, F)
    return out


@njit(cache=True, error_model="numpy", parallel=True)
def _silu_mul_par(a, ga, b, ub, out):
    T, F = out.shape
    nc = (F + _CHUNK - 1) // _CHUNK
    for i in prange(T * nc):
        t, c = i // nc, i % nc
        _silu_mul_rows(a, ga, b, ub, out, t, t + 1, c * _CHUNK, min(F, (c + 1) * _CHUNK))


@njit(cache=True, error_model="numpy", parallel=True)
def _gelu_tanh_mul_par(a, ga, b, ub, out):
    T, F = out.shape
    nc = (F + _CHUNK - 1) // _CHUNK
    for i in prange(T * nc):
        t, c = i // nc, i % nc
        _gelu_tanh_mul_rows(a, ga, b, ub, out, t, t + 1, c * _CHUNK, min(F, (c + 1) * _CHUNK))


@njit(cache=True, error_model="numpy")
def _silu_mul(a, ga, b, ub, F):
    T = a.shape[0]
    out = np.empty((T, F), np.float32)
    if T * F >= _PAR_MIN_ELEMS:
        _silu_mul_par(a, ga, b, ub, out)
    else:
        _silu_mul_rows(a, ga, b, ub, out, 0, T, 0, F)
    return out


@njit(cache=True, error_model="numpy")
def _gelu_tanh_mul(a, ga, b, ub, F):
    T = a.shape[0]
    out = np.empty((T, F), np.float32)
    if T * F >= _PAR_MIN_ELEMS:
        _gelu_tanh_mul_par(a, ga, b, ub, out)
    else:
        _gelu_tanh_mul_rows(a, ga, b, ub, out, 0, T, 0, F)
    return out


def _pair(gate: np.ndarray, up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if gate.ndim != 2 or gate.shape != up.shape:
        raise ValueError(f"gate {gate.shape} and up {up.shape} must be the same (T, F)")
    return np.ascontiguousarray(gate, dtype=np.float32), np.ascontiguousarray(up, dtype=np.float32)


def silu_mul(gate, up):
    """silu(gate) * up. gate, up f32 (T, F) (any strides) -> new f32 (T, F) C-contiguous."""
    g, u = _pair(gate, up)
    return _silu_mul(g, 0, u, 0, g.shape[1])


def gelu_tanh_mul(gate, up):
    """gelu_tanh(gate) * up (HF 'gelu_pytorch_tanh'). gate, up f32 (T, F) -> new f32 (T, F)."""
    g, u = _pair(gate, up)
    return _gelu_tanh_mul(g, 0, u, 0, g.shape[1])


# erf as a rational function of x on [-4, 4] (Eigen's fast float erf; erf(4) rounds to 1.0f): within 5e-7 of erf,
# plain float32 arithmetic that LLVM vectorizes (libm's erff is one call per element)
_ERF_A = (np.float32(-2.72614225801306e-10), np.float32(2.77068142495902e-08), np.float32(-2.10102402082508e-06),
          np.float32(-5.69250639462346e-05), np.float32(-7.34990630326855e-04), np.float32(-2.95459980854025e-03),
          np.float32(-1.60960333262415e-02))
_ERF_B = (np.float32(-1.45660718464996e-05), np.float32(-2.13374055278905e-04), np.float32(-1.68282697438203e-03),
          np.float32(-7.37332916720468e-03), np.float32(-1.42647390514189e-02))
_ERF_CLAMP = np.float32(4.0)
_INV_SQRT2 = np.float32(0.7071067811865476)


@njit(cache=True, error_model="numpy", inline="always")
def erf_f32(x):
    xc = min(max(x, -_ERF_CLAMP), _ERF_CLAMP)
    x2 = xc * xc
    p = _ERF_A[0]
    p = p * x2 + _ERF_A[1]
    p = p * x2 + _ERF_A[2]
    p = p * x2 + _ERF_A[3]
    p = p * x2 + _ERF_A[4]
    p = p * x2 + _ERF_A[5]
    p = p * x2 + _ERF_A[6]
    q = _ERF_B[0]
    q = q * x2 + _ERF_B[1]
    q = q * x2 + _ERF_B[2]
    q = q * x2 + _ERF_B[3]
    q = q * x2 + _ERF_B[4]
    return xc * p / q


@njit(cache=True, error_model="numpy")
def _gelu_range(flat, i0, i1):
    part = flat[i0:i1]  # see _silu_mul_rows
    for i in range(part.shape[0]):
        v = part[i]
        part[i] = _HALF * v * (_F1 + erf_f32(v * _INV_SQRT2))


@njit(cache=True, error_model="numpy", parallel=True)
def _gelu_par(flat):
    n = flat.shape[0]
    nc = (n + _CHUNK - 1) // _CHUNK
    for c in prange(nc):
        _gelu_range(flat, c * _CHUNK, min(n, (c + 1) * _CHUNK))


@njit(cache=True, error_model="numpy")
def _gelu_flat(flat):
    if flat.shape[0] >= _PAR_MIN_ELEMS:
        _gelu_par(flat)
    else:
        _gelu_range(flat, 0, flat.shape[0])


def gelu(x):
    """In place: x = x * Phi(x), the exact (erf) GELU (HF 'gelu', BERT's). x: C-contiguous float32, any shape."""
    if not (x.dtype == np.float32 and x.flags.c_contiguous):
        raise ValueError("gelu needs a C-contiguous float32 array (it works in place)")
    _gelu_flat(x.reshape(-1))
    return x


@njit(cache=True, error_model="numpy", parallel=True)
def _add_bias_par(y, b):
    for t in prange(y.shape[0]):
        row = y[t]
        for n in range(row.shape[0]):
            row[n] += b[n]


def add_bias(y, b):
    """In place: y (T, N) f32 C-contiguous += b (N,) f32 per row, the bits of numpy's y += b; many rows run on every
    core (a long chunk's (4096, 3072) output took numpy 5 ms on one)."""
    if y.shape[0] * y.shape[1] >= _PAR_MIN_ELEMS and y.flags.c_contiguous and y.dtype == np.float32:
        _add_bias_par(y, np.ascontiguousarray(b, dtype=np.float32))
    else:
        y += b
    return y


@njit(cache=True, error_model="numpy")
def _softcap_range(flat, cap, i0, i1):
    part = flat[i0:i1]  # see _silu_mul_rows
    for i in range(part.shape[0]):
        part[i] = cap * tanh_f32(part[i] / cap)


@njit(cache=True, error_model="numpy", parallel=True)
def _softcap_par(flat, cap):
    n = flat.shape[0]
    nc = (n + _CHUNK - 1) // _CHUNK
    for c in prange(nc):
        _softcap_range(flat, cap, c * _CHUNK, min(n, (c + 1) * _CHUNK))


@njit(cache=True, error_model="numpy")
def _softcap_flat(flat, cap):
    cap32 = np.float32(cap)
    if flat.shape[0] >= _PAR_MIN_ELEMS:
        _softcap_par(flat, cap32)
    else:
        _softcap_range(flat, cap32, 0, flat.shape[0])


def softcap(x, cap):
    """In place: x = cap * tanh(x / cap). x: C-contiguous float32 of any shape (logits (R, V))."""
    if not (x.dtype == np.float32 and x.flags.c_contiguous):
        raise ValueError("softcap needs a C-contiguous float32 array (it works in place)")
    _softcap_flat(x.reshape(-1), float(cap))
    return x
