"""A few LLVM vector values exposed to Numba, so kernels can be written as plain @njit loops.

Numba widens int8 arithmetic to int64 and never emits VNNI; these intrinsics emit LLVM vector IR
directly. Vectors live in registers as Numba values of type `Vec`; all loads are unaligned.
The host's instruction set is read once, at import (HAS_VNNI, HAS_AVX2); the int8 dot products that
depend on it live in dot.py, lane shuffles and strided or broadcast loads in simd_lanes.py.

Set RAMLM_SIMD=avx2 or RAMLM_SIMD=generic (or RAMLM_PORTABLE_SIMD=1) to force a lesser path
(kernels are then compiled without cache, so the host's cached code is never reused for it).
"""
from __future__ import annotations


import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from cpu_kernels import envs


def _host_features() -> set[str]:
    try:
        flat = llvm.get_host_cpu_features().flatten()
    except Exception:  # unknown host: stay portable
        return set()
    return {f[1:] for f in flat.split(",") if f.startswith("+")}


# RAMLM_SIMD=auto|avx2|generic caps the instruction set (tests run each path on one host).
SIMD_LEVEL = envs.get("RAMLM_SIMD")
FORCE_PORTABLE = envs.get("RAMLM_PORTABLE_SIMD") or SIMD_LEVEL == "generic"
HOST_FEATURES = _host_features()
HAS_VNNI = not FORCE_PORTABLE and SIMD_LEVEL == "auto" and {"avx512vnni", "avx512vl", "avx512bw"} <= HOST_FEATURES
# AVX2 without VNNI (Zen 3, Haswell..Alder Lake): dpbusd as vpmaddubsw/vpmaddwd pairs, llama.cpp's way.
HAS_AVX2 = not FORCE_PORTABLE and not HAS_VNNI and "avx2" in HOST_FEATURES
# Kernels decorated with cache=CACHE: a capped flavour must never load the cached code of the host's own.
CACHE = not FORCE_PORTABLE and SIMD_LEVEL == "auto"


def _amx_permitted() -> bool:
    """Whether Linux supports AMX tile state here: the CPU may list AMX while the kernel or the hypervisor does not
    (AMX code run there dies with SIGILL, as llama.cpp's native build does on some VMs). Asks arch_prctl
    ARCH_GET_XCOMP_SUPP, which changes nothing (oneDNN requests the tiles itself before it uses them, and falls back
    to AVX-512 when refused)."""
    import platform
    import sys
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        mask = ctypes.c_uint64(0)
        ok = libc.syscall(158, 0x1021, ctypes.byref(mask)) == 0  # SYS_arch_prctl, ARCH_GET_XCOMP_SUPP
        return ok and bool(mask.value >> 18 & 1)  # XFEATURE_XTILEDATA
    except (OSError, AttributeError):
        return False


# oneDNN's bf16 GEMMs and attention run on AMX tiles here (torch asks for them): the long-prefill paths follow.
AMX = "amx-bf16" in HOST_FEATURES and _amx_permitted()

_LL = {"i8": ir.IntType(8), "i16": ir.IntType(16), "i32": ir.IntType(32), "f32": ir.FloatType()}


class Vec(types.Type):
    """An LLVM <n x kind> vector held in registers."""

    def __init__(self, kind: str, n: int):
        self.kind, self.n = kind, n
        super().__init__(name=f"vec_{kind}x{n}")


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_LL[fe_type.kind], fe_type.n))


u8x8, u8x16, u8x32 = Vec("i8", 8), Vec("i8", 16), Vec("i8", 32)
i32x8, f32x8, f32x16 = Vec("i32", 8), Vec("f32", 8), Vec("f32", 16)
i16x16 = Vec("i16", 16)
_I32 = ir.IntType(32)


def _ptr(context, builder, arrty, arr, idx, elem_ll):
    """Address of arr.flat[idx] (C-contiguous array) cast to elem_ll*."""
    a = context.make_array(arrty)(context, builder, arr)
    p = builder.gep(a.data, [idx])
    return builder.bitcast(p, elem_ll.as_pointer())


def _splat(builder, scalar, n):
    v = builder.insert_element(ir.Constant(ir.VectorType(scalar.type, n), ir.Undefined), scalar,
                               ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), [0] * n))


def _make_load(vt: Vec, dtypes):
    @intrinsic
    def load(typingctx, arr, idx):
        if not (isinstance(arr, types.Array) and arr.dtype in dtypes and isinstance(idx, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            i = context.cast(builder, args[1], sig.args[1], types.intp)
            p = _ptr(context, builder, sig.args[0], args[0], i, context.get_value_type(sig.return_type))
            return builder.load(p, align=1)
        return vt(arr, idx), codegen
    return load


# load_X(arr, i): the vector starting at element i of a C-contiguous array (i counts arr's elements).
load_u8x8 = _make_load(u8x8, (types.uint8, types.int8))
load_u8x16 = _make_load(u8x16, (types.uint8, types.int8))
load_u8x32 = _make_load(u8x32, (types.uint8, types.int8))
load_i32x8 = _make_load(i32x8, (types.int32,))
load_f32x8 = _make_load(f32x8, (types.float32,))
load_f32x16 = _make_load(f32x16, (types.float32,))


def _make_load_f16(n: int):
    @intrinsic
    def load(typingctx, arr, idx):
        """n float16 values (stored as uint16 or float16) widened to float32 lanes (vcvtph2ps)."""
        if not (isinstance(arr, types.Array) and isinstance(idx, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            i = context.cast(builder, args[1], sig.args[1], types.intp)
            p = _ptr(context, builder, sig.args[0], args[0], i, ir.VectorType(ir.HalfType(), n))
            return builder.fpext(builder.load(p, align=1), ir.VectorType(ir.FloatType(), n))
        return Vec("f32", n)(arr, idx), codegen
    return load


load_f16x8 = _make_load_f16(8)
load_f16x16 = _make_load_f16(16)


@intrinsic
def load_bf16x16(typingctx, arr, idx):
    """16 bfloat16 values (stored as uint16) widened to f32x16."""
    if not (isinstance(arr, types.Array) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        p = _ptr(context, builder, sig.args[0], args[0], i, ir.VectorType(ir.IntType(16), 16))
        w = builder.zext(builder.load(p, align=1), ir.VectorType(_I32, 16))
        w = builder.shl(w, _splat(builder, ir.Constant(_I32, 16), 16))
        return builder.bitcast(w, ir.VectorType(ir.FloatType(), 16))
    return f32x16(arr, idx), codegen


def _make_zero(vt: Vec):
    @intrinsic
    def zero(typingctx):
        def codegen(context, builder, sig, args):
            return ir.Constant(context.get_value_type(sig.return_type), None)
        return vt(), codegen
    return zero


zero_i32x8 = _make_zero(i32x8)
zero_f32x8 = _make_zero(f32x8)
zero_f32x16 = _make_zero(f32x16)


def _binop(name):
    @intrinsic
    def op(typingctx, a, b):
        """Elementwise a <op> b on equal vector types; b may be a scalar (splat)."""
        if not isinstance(a, Vec):
            return None
        if not (b == a or isinstance(b, (types.Integer, types.Float))):
            return None

        def codegen(context, builder, sig, args):
            va, vb = args
            ll = context.get_value_type(sig.args[0])
            if not isinstance(sig.args[1], Vec):
                vb = context.cast(builder, vb, sig.args[1],
                                  types.float32 if a.kind == "f32" else types.int64)
                if a.kind != "f32":
                    vb = builder.trunc(vb, ll.element) if ll.element.width < 64 else vb
                vb = _splat(builder, vb, ll.count)
            return getattr(builder, _OPS[name][a.kind == "f32"])(va, vb)
        return a(a, b), codegen
    return op


_OPS = {"add": ("add", "fadd"), "sub": ("sub", "fsub"), "mul": ("mul", "fmul"),
        "and_": ("and_", None), "or_": ("or_", None), "shr": ("lshr", None), "shl": ("shl", None)}
vadd, vsub, vmul, vand, vor, vshr, vshl = (_binop(n) for n in ("add", "sub", "mul", "and_", "or_", "shr", "shl"))


@intrinsic
def muladd(typingctx, acc, a, b):
    """acc + a * b (f32 vectors; b may be a float scalar, splat). Not fused: rounding is fixed."""
    if not (isinstance(acc, Vec) and acc.kind == "f32" and a == acc):
        return None
    if not (b == acc or isinstance(b, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        vacc, va, vb = args
        if not isinstance(sig.args[2], Vec):
            vb = _splat(builder, context.cast(builder, vb, sig.args[2], types.float32), acc.n)
        return builder.fadd(vacc, builder.fmul(va, vb))
    return acc(acc, a, b), codegen


@intrinsic
def to_f32(typingctx, v):
    """Signed int32 lanes -> float32 lanes."""
    if not (isinstance(v, Vec) and v.kind == "i32"):
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], ir.VectorType(ir.FloatType(), v.n))
    return Vec("f32", v.n)(v), codegen


def _make_bytes_to_f32(signed: bool):
    @intrinsic
    def conv(typingctx, v):
        if not (isinstance(v, Vec) and v.kind == "i8"):
            return None

        def codegen(context, builder, sig, args):
            ft = ir.VectorType(ir.FloatType(), v.n)
            return builder.sitofp(args[0], ft) if signed else builder.uitofp(args[0], ft)
        return Vec("f32", v.n)(v), codegen
    return conv


# Byte lanes -> float32 lanes, read as unsigned (u8_to_f32) or signed (i8_to_f32) bytes.
u8_to_f32 = _make_bytes_to_f32(False)
i8_to_f32 = _make_bytes_to_f32(True)


@intrinsic
def bcast(typingctx, v, j):
    """Every lane set to lane j of v (j should be a constant after unrolling)."""
    if not (isinstance(v, Vec) and isinstance(j, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        e = builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1], types.int32))
        return _splat(builder, e, v.n)
    return v(v, j), codegen


@intrinsic
def hsum(typingctx, v):
    """Sum of the lanes, in a fixed pairwise order (halves added until one lane is left)."""
    if not isinstance(v, Vec):
        return None
    rt = types.float32 if v.kind == "f32" else types.int64

    def codegen(context, builder, sig, args):
        x, n = args[0], v.n
        add = builder.fadd if v.kind == "f32" else builder.add
        while n > 1:
            h = n // 2
            lo = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_I32, h), list(range(h))))
            hi = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_I32, h), list(range(h, n))))
            x, n = add(lo, hi), h
        s = builder.extract_element(x, ir.Constant(_I32, 0))
        return s if v.kind == "f32" else builder.sext(s, ir.IntType(64))
    return rt(v), codegen


@intrinsic
def concat(typingctx, a, b):
    """[a, b] for two vectors of one type."""
    if not (isinstance(a, Vec) and a == b):
        return None

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[1], ir.Constant(ir.VectorType(_I32, 2 * a.n),
                                                                     list(range(2 * a.n))))
    return Vec(a.kind, 2 * a.n)(a, b), codegen


@intrinsic
def bits_to_bytes(typingctx, bits):
    """uint32 -> u8x32 whose byte i is bit i of `bits` (0 or 1)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        b = context.cast(builder, args[0], sig.args[0], types.uint32)
        m = builder.bitcast(b, ir.VectorType(ir.IntType(1), 32))
        return builder.zext(m, ir.VectorType(ir.IntType(8), 32))
    return u8x32(bits), codegen


@intrinsic
def f16_to_f32(typingctx, h):
    """float16 bits (uint16) -> float32, for finite values (subnormals included).

    Integer moves and one multiply by 2**112 rather than a scalar vcvtph2ps, whose partial register
    write LLVM tends to merge into a live accumulator (a false dependency that serializes the loop)."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        b = builder.and_(context.cast(builder, args[0], sig.args[0], types.uint32), ir.Constant(_I32, 0xFFFF))
        mag = builder.shl(builder.and_(b, ir.Constant(_I32, 0x7FFF)), ir.Constant(_I32, 13))
        f = builder.fmul(builder.bitcast(mag, ir.FloatType()), ir.Constant(ir.FloatType(), 2.0 ** 112))
        sign = builder.shl(builder.and_(b, ir.Constant(_I32, 0x8000)), ir.Constant(_I32, 16))
        return builder.bitcast(builder.or_(builder.bitcast(f, _I32), sign), ir.FloatType())
    return types.float32(h), codegen


@intrinsic
def bf16_to_f32(typingctx, h):
    """bfloat16 bits (uint16) -> float32."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        b = builder.and_(context.cast(builder, args[0], sig.args[0], types.uint32), ir.Constant(_I32, 0xFFFF))
        return builder.bitcast(builder.shl(b, ir.Constant(_I32, 16)), ir.FloatType())
    return types.float32(h), codegen


# Bytes ahead that the GEMVs ask the memory system for: the hardware prefetcher alone streamed the 262144 x 640
# output matrix at ~27 GB/s and long rows (K = 14336) at half the speed of short ones.
PREFETCH_AHEAD = 2048
# The K-quants' streams (Q4_K, Q6_K) go further ahead and into L2 only (prefetcht1): Q6_K 4096 x 14336 from DRAM
# streamed 22-30 GB/s with prefetcht0 at 2 or 4 KB, 30-38 GB/s this way (in-process, alternating); the Q8_0 output
# matrix did not gain.
PREFETCH_AHEAD_L2 = 4096


def _make_prefetch(locality: int, doc: str):
    @intrinsic
    def prefetch(typingctx, arr, idx):
        if not (isinstance(arr, types.Array) and isinstance(idx, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            i = context.cast(builder, args[1], sig.args[1], types.intp)
            p = builder.bitcast(_ptr(context, builder, sig.args[0], args[0], i, context.get_data_type(arr.dtype)),
                                ir.IntType(8).as_pointer())
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [
                ir.IntType(8).as_pointer(), _I32, _I32, _I32]), "llvm.prefetch.p0i8")
            builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, locality), ir.Constant(_I32, 1)])
            return context.get_dummy_value()
        return types.none(arr, idx), codegen
    prefetch.__doc__ = doc
    return prefetch


prefetch = _make_prefetch(3, "A read hint for arr.flat[idx] into L1 (may lie past the end: a prefetch never faults).")
prefetch_l2 = _make_prefetch(2, "prefetch into L2 only (prefetcht1).")


@intrinsic
def store(typingctx, arr, idx, v):
    """arr.flat[idx:idx + n] = v: f32 lanes as float32 into a float32 array, or rounded to bfloat16 bits (nearest
    even, as gguf's BF16 quantizer) into a uint16 array; byte lanes (i8 vectors) into a uint8 array."""
    if not (isinstance(arr, types.Array) and isinstance(idx, types.Integer) and isinstance(v, Vec)
            and ((v.kind == "f32" and arr.dtype in (types.float32, types.uint16))
                 or (v.kind == "i8" and arr.dtype == types.uint8))):
        return None
    bf16 = arr.dtype == types.uint16

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        val = args[2]
        if bf16:
            vi = ir.VectorType(_I32, v.n)
            b = builder.bitcast(val, vi)
            odd = builder.and_(builder.lshr(b, _splat(builder, ir.Constant(_I32, 16), v.n)),
                               _splat(builder, ir.Constant(_I32, 1), v.n))
            b = builder.add(builder.add(b, _splat(builder, ir.Constant(_I32, 0x7FFF), v.n)), odd)
            val = builder.trunc(builder.lshr(b, _splat(builder, ir.Constant(_I32, 16), v.n)),
                                ir.VectorType(ir.IntType(16), v.n))
        p = _ptr(context, builder, sig.args[0], args[0], i, val.type)
        builder.store(val, p, align=1)
        return context.get_dummy_value()
    return types.none(arr, idx, v), codegen
