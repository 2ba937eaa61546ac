"""Every registered weight format against its numpy oracle (gguf's dequantize; qtypes' for ramlm's FP8) and float64
matmuls."""
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from cpu_kernels.quant import FORMATS, QuantLinear, quantize
from cpu_kernels.quant.linear import GEMV_MAX_M
from cpu_kernels.quant.q8act import quantize_act, quantize_act_ref
from cpu_kernels.quant.qtypes import RamlmType, dequantize

TYPES = list(FORMATS)
# Round-trip error (relative RMS) of our quantizers on Gaussian weights; the K-quant ones are simple.
ROUNDTRIP_TOL = {Q.F32: 0, Q.F16: 1e-3, Q.BF16: 5e-3, Q.Q8_0: 1e-2, Q.Q6_K: 3e-2, Q.Q5_0: 5e-2,
                 Q.Q5_1: 5e-2, Q.Q5_K: 6e-2, Q.Q4_0: 0.1, Q.Q4_1: 0.1, Q.Q4_K: 0.1, Q.Q3_K: 0.25, Q.Q2_K: 0.4,
                 Q.MXFP4: 0.13, Q.IQ4_NL: 0.09, Q.IQ4_XS: 0.09, RamlmType.FP8_E4M3: 0.04, RamlmType.U8_ZP: 1e-2,
                 RamlmType.Q8_A16: 1e-2,
                 Q.TQ1_0: 0.9, Q.TQ2_0: 0.9}
# Formats ramlm runs but cannot write (llama.cpp's grid search with an importance matrix makes them): their cases are
# random blocks of the file layout, every bit pattern of which is a valid block.
from cpu_kernels.quant.quantize import UNWRITTEN as NO_QUANTIZER  # noqa: E402


def shapes(t):
    """(N, K) cases: an odd N with a single block per row, and a few blocks per row."""
    bs = FORMATS[t].block_size
    if bs == 1:
        return [(13, 19), (37, 83)]
    return [(13, bs), (37, {256: 512, 128: 384, 64: 320}.get(bs, 160))]


def make(t, N, K, seed=0):
    rng = np.random.default_rng(seed)
    if t in NO_QUANTIZER:
        from bench.make_synthetic import random_tensor
        raw = random_tensor(rng, t, (N, K), std=1.0)
        deq = dequantize(raw, t).reshape(N, K)
        return deq, raw, deq
    w = rng.standard_normal((N, K)).astype(np.float32)
    raw = quantize(t, w)
    return w, raw, dequantize(raw, t).reshape(N, K)


def typed_raw(t, raw, K):
    """What GGUFFile.raw hands over: typed arrays for F32/F16/BF16, uint8 rows otherwise."""
    dtype = {Q.F32: np.float32, Q.F16: np.float16, Q.BF16: np.uint16}.get(t)
    return raw if dtype is None else raw.view(dtype).reshape(raw.shape[0], K)


def rel_err(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


@pytest.fixture(scope="module", params=TYPES, ids=lambda t: t.name)
def case(request):
    t = request.param
    return t, [(N, K) + make(t, N, K) for N, K in shapes(t)]


def test_quantize_round_trip(case):
    t, cases = case
    if t in NO_QUANTIZER:
        with pytest.raises(NotImplementedError, match="does not write"):
            quantize(t, cases[0][2])
        return
    for N, K, w, raw, deq in cases:
        assert raw.dtype == np.uint8 and raw.shape == (N, FORMATS[t].row_bytes(K))
        err = np.sqrt(((deq - w) ** 2).mean() / (w ** 2).mean())
        assert err <= ROUNDTRIP_TOL[t], (t.name, err)


def test_dequantize_matches_gguf(case):
    t, cases = case
    for N, K, w, raw, deq in cases:
        for r in (raw, typed_raw(t, raw, K)):
            lin = QuantLinear.from_raw(t, r, (N, K))
            assert (lin.N, lin.K, lin.ggml_type) == (N, K, t) and lin.nbytes > 0
            np.testing.assert_array_equal(lin.dequantize(), deq)


def test_embed_rows(case):
    t, cases = case
    for N, K, w, raw, deq in cases:
        lin = QuantLinear.from_raw(t, raw, (N, K))
        ids = np.array([3, 0, N - 1, 3])
        np.testing.assert_array_equal(lin.embed(ids), deq[ids])
        assert lin.embed(np.array([], np.int64)).shape == (0, K)
        with pytest.raises(IndexError):
            lin.embed(np.array([N]))


@pytest.mark.parametrize("M", [1, 5, 70])
def test_matmul_matches_float64(case, M):
    t, cases = case
    tol = 1e-2 if FORMATS[t].int8_activations else 1e-5  # Q8 activations cost ~0.5 %, on both paths
    if t in (RamlmType.Q8_A16, RamlmType.U8_ZP):  # activations to 16-bit precision: their residual's int8 rounding
        tol = 1e-4
    for N, K, w, raw, deq in cases:
        lin = QuantLinear.from_raw(t, raw, (N, K))
        x = np.random.default_rng(M).standard_normal((M, K)).astype(np.float32)
        ref = x.astype(np.float64) @ deq.astype(np.float64).T
        if t in NO_QUANTIZER:  # random blocks' scales span 30x: against the Q8 activations, whose dots are exact
            ref, tol = q8_of(x) @ deq.astype(np.float64).T, 1e-5
        got = lin.matmul(x)
        assert got.shape == (M, N) and got.dtype == np.float32
        assert rel_err(got, ref) < tol, (t.name, N, K, M, rel_err(got, ref))
        out = np.full((M, N), np.nan, np.float32)
        assert lin.matmul(x, out=out) is out
        np.testing.assert_array_equal(out, got)


@pytest.mark.parametrize("t", [Q.Q8_0, Q.Q4_K, Q.F16, RamlmType.FP8_E4M3], ids=lambda t: t.name)
def test_dequantize_to_bf16_bits(t):
    """Dequantizing into uint16 gives gguf's values rounded to bfloat16 (nearest even), what the
    bfloat16 prefill path multiplies."""
    for N, K in shapes(t):
        w, raw, deq = make(t, N, K)
        lin = QuantLinear.from_raw(t, raw, (N, K))
        rows = np.array([N - 1, 0, 2], np.int64)
        out = np.empty((3, K), np.uint16)
        lin.fmt.dequant(*lin.packed, rows, out)
        want = gguf.quants.quantize(np.ascontiguousarray(deq[rows]), Q.BF16).view(np.uint16).reshape(3, K)
        np.testing.assert_array_equal(out, want)


def test_bf16_prefill_matches_float64(case):
    """The bfloat16 dense path: inputs and outputs rounded to bf16 (2**-9 relative each), and really taken."""
    t, cases = case
    for N, K, w, raw, deq in cases:
        lin = QuantLinear.from_raw(t, raw, (N, K))
        x = np.random.default_rng(5).standard_normal((GEMV_MAX_M + 9, K)).astype(np.float32)
        ref = x.astype(np.float64) @ deq.astype(np.float64).T
        got = lin.matmul(x, dense_dtype="bfloat16")
        assert got.shape == (x.shape[0], N) and got.dtype == np.float32
        assert rel_err(got, ref) < 2e-2, (t.name, rel_err(got, ref))
        assert not np.array_equal(got, lin.matmul(x))  # not the float32 path
        bf16_bits = got.view(np.uint32) & 0xFFFF
        assert not bf16_bits.any()  # every output is a bfloat16 value: torch's bf16 GEMM ran
        np.testing.assert_array_equal(lin.matmul(x[:3], dense_dtype="bfloat16"), lin.matmul(x[:3]))  # GEMV rows
    with pytest.raises(ValueError, match="dense_dtype"):
        lin.matmul(x, dense_dtype="float16")


def test_auto_long_matmul_is_bf16_where_native_else_the_int8_gemv(case):
    """dense_dtype="auto" above GEMV_MAX_M rows: the GEMV for the formats marked gemv_prefill where it beats the
    GEMM (no native bf16, or K >= the format's gemv_prefill_min_k), bitwise what each row gives alone; else
    oneDNN's bf16 GEMM where the CPU has native bf16, and float32 GEMM elsewhere."""
    from cpu_kernels.quant.linear import auto_dense_dtype
    t, cases = case
    N, K, w, raw, deq = cases[0]
    lin = QuantLinear.from_raw(t, raw, (N, K))
    x = np.random.default_rng(6).standard_normal((GEMV_MAX_M + 9, K)).astype(np.float32)
    got = lin.matmul(x, dense_dtype="auto")
    native = auto_dense_dtype() == "bfloat16"
    if lin.fmt.gemv_prefill and (not native or 0 < lin.fmt.gemv_prefill_min_k <= K):
        np.testing.assert_array_equal(got, lin.matmul(x, batch_invariant=True))
    elif native:
        np.testing.assert_array_equal(got, lin.matmul(x, dense_dtype="bfloat16"))
    else:
        np.testing.assert_array_equal(got, lin.matmul(x, dense_dtype="float32"))


def test_gemv_prefill_min_k_follows_the_host():
    """With two-group passes and no AMX (WIDE_PREFILL) the GEMV takes long chunks of Q4_K, Q5_0, Q4_0 and Q8_0 (and the
    formats on their kernels) at every K and Q6_K from the 8B shapes on; with AMX the bf16 GEMM takes them all; elsewhere the GEMV takes Q4_K from
    K = 4096."""
    from cpu_kernels.quant.registry import AMX, WIDE_PREFILL
    want = ({Q.Q4_K: 256, Q.Q5_0: 32, Q.Q4_0: 32, Q.Q8_0: 32, Q.Q6_K: 4096, Q.MXFP4: 32, Q.IQ4_NL: 32,
             Q.IQ4_XS: 32, RamlmType.U8_ZP: 32, RamlmType.Q8_A16: 32} if WIDE_PREFILL else {} if AMX
            else {Q.Q4_K: 4096})
    got = {t: f.gemv_prefill_min_k for t, f in FORMATS.items() if f.gemv_prefill_min_k}
    assert got == want


def test_auto_long_matmul_takes_the_gemv_from_min_k_on():
    """Q4_K with K >= gemv_prefill_min_k runs the int8 GEMV for long chunks even where bf16 is native: bitwise
    what each row gives alone."""
    fmt = FORMATS[Q.Q4_K]
    if not fmt.gemv_prefill_min_k:
        pytest.skip("AMX host: long chunks of every K take the bf16 GEMM")
    assert fmt.gemv_prefill and fmt.gemv_prefill_min_k in (256, 4096)
    N, K = 16, fmt.gemv_prefill_min_k
    w, raw, deq = make(Q.Q4_K, N, K)
    lin = QuantLinear.from_raw(Q.Q4_K, raw, (N, K))
    x = np.random.default_rng(7).standard_normal((GEMV_MAX_M + 5, K)).astype(np.float32)
    np.testing.assert_array_equal(lin.matmul(x, dense_dtype="auto"), lin.matmul(x, batch_invariant=True))


@pytest.mark.parametrize("dense", ["float32", "bfloat16", "auto", "int8"])
def test_spans_equal_each_span_alone(case, dense):
    """A step's long prompts through matmul_spans (W's tiles dequantized once for all): each span's rows are bit for
    bit what matmul gives for that span alone; rows outside the spans are left as they were."""
    t, cases = case
    for N, K, w, raw, deq in cases[:2]:
        lin = QuantLinear.from_raw(t, raw, (N, K))
        x = np.random.default_rng(7).standard_normal((3 * GEMV_MAX_M + 12, K)).astype(np.float32)
        spans = [(0, GEMV_MAX_M + 1), (GEMV_MAX_M + 5, 3 * GEMV_MAX_M + 12)]
        y = np.full((x.shape[0], N), 7.0, np.float32)
        lin.matmul_spans(x, spans, y, dense)
        for a, b in spans:
            np.testing.assert_array_equal(y[a:b], lin.matmul(x[a:b], dense_dtype=dense))
        assert (y[GEMV_MAX_M + 1:GEMV_MAX_M + 5] == 7.0).all()
    with pytest.raises(ValueError, match="spans"):
        lin.matmul_spans(x, [(0, GEMV_MAX_M)], y)


def test_prefill_in_several_tiles(monkeypatch):
    import cpu_kernels.quant.linear as linear
    for t in (Q.Q4_K, Q.Q8_0, Q.F16):
        N, K = 37, 256
        w, raw, deq = make(t, N, K)
        lin = QuantLinear.from_raw(t, raw, (N, K))
        x = np.random.default_rng(3).standard_normal((GEMV_MAX_M + 8, K)).astype(np.float32)  # dense path
        whole = lin.matmul(x)
        monkeypatch.setattr(linear, "TILE_ELEMS", 16 * K)  # 16 rows per tile: 3 tiles
        monkeypatch.setattr(linear, "MIN_TILE_ROWS", 16)
        # float32 GEMM blocking differs by tile shape: equal to float32 rounding, not bitwise
        np.testing.assert_allclose(lin.matmul(x), whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())
        monkeypatch.undo()
        assert rel_err(whole, x.astype(np.float64) @ deq.astype(np.float64).T) < 1e-2


def test_batch_invariant_rows_equal_single_row(case):
    t, cases = case
    for N, K, w, raw, deq in cases:
        lin = QuantLinear.from_raw(t, raw, (N, K))
        # 3 rows as one padded 4-row pass, 4-row passes with one or two rows left alone (5, 6) and with a pass moved
        # back to end at M (11)
        for M in (3, 5, 6, 11):
            x = np.random.default_rng(M).standard_normal((M, K)).astype(np.float32)
            got = lin.matmul(x, batch_invariant=True)
            for i in range(x.shape[0]):
                np.testing.assert_array_equal(got[i], lin.matmul(x[i:i + 1])[0])
        np.testing.assert_array_equal(lin.matmul(x[0]), got[0])  # 1-D x -> 1-D result


def test_stack_and_rows(case):
    """Stacked parts compute each part's rows bitwise; rows() views give the parts back; slices that cut an
    interleaved row block are refused."""
    t, cases = case
    N0, K = 16, cases[1][1]
    parts = [QuantLinear.from_raw(t, make(t, n, K, seed=n)[1], (n, K)) for n in (N0, 13)]
    whole = QuantLinear.stack(parts)
    x = np.random.default_rng(2).standard_normal((5, K)).astype(np.float32)
    got = whole.matmul(x)
    np.testing.assert_array_equal(got, np.concatenate([p.matmul(x) for p in parts], axis=1))
    np.testing.assert_array_equal(whole.rows(N0, N0 + 13).matmul(x), parts[1].matmul(x))
    np.testing.assert_array_equal(whole.rows(0, N0).embed([3, 15]), parts[0].embed([3, 15]))
    if FORMATS[t].row_block > 1:
        with pytest.raises(ValueError, match="whole"):
            whole.rows(FORMATS[t].row_block // 2, N0)
        with pytest.raises(ValueError, match="N %"):
            QuantLinear.stack(parts[::-1])


@pytest.mark.parametrize("t", [Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.Q4_K, Q.Q6_K, Q.MXFP4, Q.IQ4_NL, Q.IQ4_XS,
                               RamlmType.FP8_E4M3], ids=lambda t: t.name)
def test_numba_repack_equals_numpy(t):
    """The load-time Numba repackers against their numpy twins, on writable and read-only (memmap-like) rows."""
    from cpu_kernels.quant import repack
    fast, ref = getattr(repack, t.name.lower()), getattr(repack, t.name.lower() + "_numpy")
    raw = quantize(t, np.random.default_rng(7).standard_normal((37, 512)).astype(np.float32))
    ro = raw.copy()
    ro.setflags(write=False)
    want = ref(raw)
    for r in (raw, ro):
        got = fast(r)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.flags.c_contiguous
            np.testing.assert_array_equal(g, w)


def test_activation_quantizer_matches_numpy():
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    x[1, :32] = 0  # an all-zero block
    for got, ref in zip(quantize_act(x), quantize_act_ref(x)):
        np.testing.assert_array_equal(got, ref)


def test_rejects_bad_inputs():
    raw = quantize(Q.Q8_0, np.zeros((4, 64), np.float32))
    with pytest.raises(ValueError):
        QuantLinear.from_raw(Q.Q8_0, raw, (4, 96))
    with pytest.raises(NotImplementedError, match="Q8_1 is not supported"):  # llama.cpp's activation-only type
        QuantLinear.from_raw(Q.Q8_1, raw, (4, 64))
    with pytest.raises(ValueError):
        QuantLinear.from_raw(Q.Q8_0, raw, (4, 64)).matmul(np.zeros((2, 32), np.float32))


_DPBUSD_CHECK = """
import sys
import numpy as np
from numba import njit
from cpu_kernels.quant import dot, simd

@njit
def dots(acc, a, b, out, kind):
    for i in range(a.shape[0] // 32):
        acc_i, a_i, b_i = simd.load_i32x8(acc, 8 * i), simd.load_u8x32(a, 32 * i), simd.load_u8x32(b, 32 * i)
        if kind == 0:
            v = dot.dpbusd(acc_i, a_i, b_i)
        elif kind == 1:
            v = dot.dpbusd7(acc_i, a_i, b_i)
        else:
            v = dot.dpbusd_q8(acc_i, a_i, b_i)
        simd.store(out, 8 * i, simd.to_f32(v))

@njit
def run_of(a, b, n, out):
    acc = dot.zero_acc()
    for _ in range(n):
        acc = dot.dpbusd_acc(acc, simd.load_u8x32(a, 0), simd.load_u8x32(b, 0))
    simd.store(out, 0, simd.to_f32(dot.acc_i32(acc)))

def inputs():
    rng = np.random.default_rng(0)
    acc = rng.integers(-2**20, 2**20, 64).astype(np.int32)
    a, b = rng.integers(0, 256, (2, 256)).astype(np.uint8)
    a[:32], b[:32] = 255, 128  # the extremes: 255 x -128 in every byte of the first lanes
    return acc, a, b

def run():
    acc, a, b = inputs()
    out = np.empty(192, np.float32)
    dots(acc, a, b, out[:64], 0)
    dots(acc, a & 127, b, out[64:128], 1)  # dpbusd7: weights below 128
    dots(acc, a, np.maximum(b.view(np.int8), -127).view(np.uint8), out[128:], 2)  # dpbusd_q8: activations > -128
    runs = np.empty(16, np.float32)  # the longest short-accumulator runs at their extremes: 8 x 4-bit, 4 x 5-bit
    run_of(np.full(32, 15, np.uint8), np.full(32, 128, np.uint8), 8, runs[:8])
    run_of(np.full(32, 31, np.uint8), np.full(32, 128, np.uint8), 4, runs[8:])
    return np.concatenate([out, runs])

if __name__ == "__main__":
    sys.stdout.write(f"{simd.HAS_VNNI} {simd.HAS_AVX2} {dot.Q8_OFFSET} " + run().tobytes().hex())
"""


def _dpbusd(level: str):
    env = dict(os.environ, RAMLM_SIMD=level, RAMLM_PORTABLE_SIMD="0", NUMBA_DISABLE_JIT="0")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", _DPBUSD_CHECK], env=env, cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    has_vnni, has_avx2, q8_offset, hexed = res.stdout.split()
    return has_vnni == "True", has_avx2 == "True", int(q8_offset), np.frombuffer(bytes.fromhex(hexed), np.float32)


def test_dpbusd_every_instruction_set_agrees_with_numpy():
    """dpbusd, dpbusd7 and dpbusd_q8 give exactly vpdpbusd's sums (dpbusd_q8: less 128 - Q8_OFFSET per weight),
    and short accumulators hold their longest runs at the extremes, on this host's path, on the AVX2 path (when
    the host has AVX2) and on the generic-IR path."""
    from cpu_kernels.quant import dot, simd
    scope = {}
    exec(_DPBUSD_CHECK.split('if __name__')[0], scope)  # the same kernel, compiled here for this host
    acc, a, b = scope["inputs"]()
    b_q8 = np.maximum(b.view(np.int8), -127)

    def want(q8_offset):
        dot = lambda w, x: (w.astype(np.int64) * x).reshape(64, 4).sum(-1)
        return np.concatenate([acc + dot(a, b.view(np.int8)), acc + dot(a & 127, b.view(np.int8)),
                               acc + dot(a.astype(np.int64) - 128 + q8_offset, b_q8),
                               np.full(8, 8 * 4 * 15 * -128), np.full(8, 4 * 4 * 31 * -128)]).astype(np.float32)

    np.testing.assert_array_equal(scope["run"](), want(dot.Q8_OFFSET))
    vnni, avx2, offset, generic = _dpbusd("generic")
    assert not vnni and not avx2 and offset == 128
    np.testing.assert_array_equal(generic, want(128))
    if "avx2" in simd.HOST_FEATURES:
        vnni, avx2, offset, capped = _dpbusd("avx2")
        assert not vnni and avx2 and offset == 0
        np.testing.assert_array_equal(capped, want(0))


_GEMV_CHECK = """
import sys
import numpy as np
from cpu_kernels.quant import QuantLinear, quantize
from gguf import GGMLQuantizationType as Q

rng = np.random.default_rng(1)
outs = []
for t in (Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4, Q.IQ4_NL, Q.IQ4_XS):
    w = rng.standard_normal((40, 512)).astype(np.float32)  # two 16-row pairs and a single group
    lin = QuantLinear.from_raw(t, quantize(t, w), w.shape)
    for m in (1, 6, 9):  # 9: two-group passes where the host has them (wide.PAIR)
        outs.append(lin.matmul(rng.standard_normal((m, 512)).astype(np.float32)).ravel())
    if t in (Q.MXFP4, Q.IQ4_XS):  # their code tables (vpshufb or selects) in the dequantizers too
        outs.append(lin.dequantize().ravel())
sys.stdout.write(np.concatenate(outs).tobytes().hex())
"""


@pytest.mark.skipif(not __import__("cpu_kernels.quant.simd", fromlist=["x"]).HOST_FEATURES >= {"avx2"},
                    reason="the host has no AVX2")
def test_gemv_is_bitwise_equal_on_every_instruction_set():
    """Every int8 GEMV format gives the same bits on the host's path, capped at AVX2 and on generic IR
    (dpbusd7 assumes 4-6-bit weights below 128: a format breaking that would saturate vpmaddubsw here)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # the three compile at once: each compiles on one thread, so they share the cores rather than queue
    procs = {level: subprocess.Popen([sys.executable, "-c", _GEMV_CHECK], env=dict(os.environ, RAMLM_SIMD=level),
                                     cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for level in ("auto", "avx2", "generic")}
    got = {}
    for level, proc in procs.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-2000:]
        got[level] = np.frombuffer(bytes.fromhex(out), np.float32)
    assert got["auto"].size == 8 * 40 * 16 + 2 * 40 * 512 and np.isfinite(got["auto"]).all()
    np.testing.assert_array_equal(got["avx2"], got["auto"])
    np.testing.assert_array_equal(got["generic"], got["auto"])


def test_dpbusd16_agrees_with_numpy():
    """The two-group passes' 512-bit dot (wide.dpbusd16) gives vpdpbusd's exact sums on this host's path."""
    from numba import njit
    from cpu_kernels.quant import simd, wide

    @njit
    def run(acc, a, b, out):
        v = wide.dpbusd16(wide.splat_i32x16(acc), wide.load_u8x64(a, 0), wide.load_u8x64(b, 0))
        simd.store(out, 0, simd.to_f32(v))

    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 256, (2, 64)).astype(np.uint8)
    a[:4], b[:4] = 255, 128  # 255 x -128 in every byte of the first lane
    out = np.empty(16, np.float32)
    run(-12345, a, b, out)
    want = -12345 + (a.astype(np.int64) * b.view(np.int8)).reshape(16, 4).sum(-1)
    np.testing.assert_array_equal(out, want.astype(np.float32))


@pytest.mark.parametrize("t", [Q.IQ2_XXS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.TQ1_0, Q.NVFP4],
                         ids=lambda t: t.name)
def test_grid_formats_extreme_scales(t):
    """Grid i-quant and ternary blocks with their scale fields at every value (sub-scales 0 and 15, IQ1's 0..7 with
    both deltas) and fp16 scales from subnormal to 65504, negative and zero: dequantize equals gguf's bit for bit
    and the GEMV equals a float64 dot over those values (the integer dots are exact: one rounding per 16 values)."""
    rng = np.random.default_rng(9)
    N, K = 9, 512
    bs, ts = gguf.GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, size=(N, K // bs, ts), dtype=np.uint8)
    raw[0] = 0x00
    raw[1] = 0xFF
    d = np.array([0, -65504.0, 6e-8, -1e-3, 2.5e-2, 65504.0, -0.5, 1e-5, 3.0], np.float16)  # (row 0 stays zero)
    if t == Q.IQ1_M:  # fp16 d in the top nibbles of the 16-bit scale words
        bits = d.view(np.uint16)
        for i in range(4):
            top = (((bits[1:, None] >> (4 * i)) & 15) << 4).astype(np.uint8)
            raw[1:, :, 49 + 2 * i] = (raw[1:, :, 49 + 2 * i] & 0x0F) | top
    else:  # NVFP4: two of its four unsigned-e4m3 scales take d's bytes
        off = {Q.TQ1_0: 52}.get(t, 0)
        raw[1:, :, off:off + 2] = np.broadcast_to(d[1:, None, None].view(np.uint8), (N - 1, K // bs, 2))
    raw = raw.reshape(N, -1)
    with np.errstate(over="ignore", invalid="ignore"):
        deq = gguf.quants.dequantize(raw, t).reshape(N, K)
    lin = QuantLinear.from_raw(t, raw, (N, K))
    np.testing.assert_array_equal(lin.dequantize().view(np.uint32), deq.view(np.uint32))
    x = rng.standard_normal((5, K)).astype(np.float32)
    got = lin.matmul(x)
    finite = np.isfinite(deq).all(axis=1) & (np.abs(deq).max(axis=1) < 1e30)
    ref = q8_of(x) @ deq[finite].astype(np.float64).T
    np.testing.assert_allclose(got[:, finite], ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


@pytest.mark.parametrize("t", [Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K, Q.MXFP4, Q.IQ4_XS], ids=lambda t: t.name)
def test_two_group_passes_equal_single_rows(t):
    """From PAIR_MIN_M rows the 8-row-interleaved GEMVs run two groups per pass where the host has AVX-512 VNNI
    (whole 16-row pairs below N, then single groups): every row is bitwise what it gives alone. Q4_K's passes read
    the nibbles unpacked to bytes from UNPACK_MIN_M rows on: both sides of that threshold."""
    from cpu_kernels.quant.k_kquants_x8 import UNPACK_MIN_M
    from cpu_kernels.quant.wide import PAIR_MIN_M
    K = 512
    for N, M in ((16, PAIR_MIN_M + 5), (37, UNPACK_MIN_M + 3), (40, PAIR_MIN_M + 5), (40, UNPACK_MIN_M + 3)):
        lin = QuantLinear.from_raw(t, make(t, N, K, seed=N)[1], (N, K))
        x = np.random.default_rng(N).standard_normal((M, K)).astype(np.float32)
        got = lin.matmul(x, batch_invariant=True)
        for i in range(x.shape[0]):
            np.testing.assert_array_equal(got[i], lin.matmul(x[i:i + 1])[0])


def test_mxfp4_every_code_and_exponent():
    """MXFP4 blocks holding all 16 codes at the extreme exponents (e = 0 and 1 give subnormal scales, 254 and 255
    overflow float32 at the largest codes, in gguf too): dequantize equals gguf's bit for bit, and the GEMV equals a
    float64 dot over those values where they are normal."""
    K = 64
    codes = np.arange(32, dtype=np.uint8) % 16
    qs = (codes[:16] | (codes[16:] << 4)).astype(np.uint8)
    exps = [0, 1, 2, 100, 127, 128, 140, 254, 255]
    raw = np.zeros((len(exps), 2 * 17), np.uint8)
    for n, e in enumerate(exps):
        for b in range(2):
            raw[n, 17 * b] = e
            raw[n, 17 * b + 1:17 * (b + 1)] = np.roll(qs, 3 * b + n)
    with np.errstate(over="ignore"):
        deq = gguf.quants.dequantize(raw, Q.MXFP4).reshape(len(exps), K)
    lin = QuantLinear.from_raw(Q.MXFP4, raw, (len(exps), K))
    np.testing.assert_array_equal(lin.dequantize().view(np.uint32), deq.view(np.uint32))
    x = np.random.default_rng(4).standard_normal((3, K)).astype(np.float32)
    got = lin.matmul(x)
    for n in (3, 4, 5, 6):  # normal scales: the integer dot is exact, one rounding per block
        ref = q8_of(x) @ deq[n].astype(np.float64)
        np.testing.assert_allclose(got[:, n], ref, rtol=1e-5)
    assert np.isfinite(got[:, :7]).all() and (np.abs(got[:, :2]) < 1e-30).all()


@pytest.mark.parametrize("t", [Q.IQ4_NL, Q.IQ4_XS], ids=lambda t: t.name)
def test_iq4_every_code_and_scale(t):
    """IQ4 blocks holding all 16 codes, with negative, zero and extreme scales (IQ4_XS: sub-scales 0 and 63, the
    ends of ls - 32): dequantize equals gguf's bit for bit and the GEMV equals a float64 dot over those values."""
    from cpu_kernels.quant.quantize import _f16_bytes
    rng = np.random.default_rng(8)
    N, K = 11, 512
    codes = (np.arange(K) % 16).astype(np.uint8).reshape(-1, 32)
    nib = codes[:, :16] | (codes[:, 16:] << 4)
    d = np.array([1.0, -1.0, 0.0, 65504.0, 6e-8, -2.5e-3, 1e-2, 3.0, -0.5, 7e-5, 1.5], np.float32)
    if t == Q.IQ4_NL:
        blocks = np.zeros((N, K // 32, 18), np.uint8)
        blocks[..., :2] = _f16_bytes(d[:, None] * np.float32(1e-4) * (1 + np.arange(K // 32)))
        blocks[..., 2:] = np.stack([np.roll(nib, n, axis=0) for n in range(N)])
    else:
        blocks = np.zeros((N, K // 256, 136), np.uint8)
        blocks[..., :2] = _f16_bytes(np.repeat(d[:, None], K // 256, 1) * np.float32(1e-3))
        ls = rng.integers(0, 64, (N, K // 256, 8)).astype(np.uint8)
        ls[:, 0, :2] = 0, 63
        blocks[..., 2:4] = ((ls.astype(np.uint16) >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(
            -1, dtype=np.uint16)[..., None].view(np.uint8)
        blocks[..., 4:8] = (ls[..., 0::2] & 15) | ((ls[..., 1::2] & 15) << 4)
        blocks[..., 8:] = np.stack([np.roll(nib, n, axis=0) for n in range(N)]).reshape(N, K // 256, 128)
    raw = blocks.reshape(N, -1)
    deq = gguf.quants.dequantize(raw, t).reshape(N, K)
    lin = QuantLinear.from_raw(t, raw, (N, K))
    np.testing.assert_array_equal(lin.dequantize().view(np.uint32), deq.view(np.uint32))
    x = rng.standard_normal((5, K)).astype(np.float32)
    got = lin.matmul(x)
    ref = q8_of(x) @ deq.astype(np.float64).T  # the integer dot is exact: one rounding per block
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


def q8_of(x):
    """x as the int8 GEMVs see it (per-32 Q8 rounding), in float64."""
    from cpu_kernels.quant.linear import q8_roundtrip
    return q8_roundtrip(x).astype(np.float64)


def test_parallel_quantizers_equal_the_references():
    """quantize_fast against gguf's Q8_0 quantizer, torch's float8 cast and the numpy Q4_K quantizer, over 30 binades,
    zero blocks, -0.0, ties."""
    from cpu_kernels.quant.fp8_quant import quantize_rows
    from cpu_kernels.quant.qtypes import fp8_rows as rows
    from cpu_kernels.quant.quantize import _q4_k
    from cpu_kernels.quant.quantize_fast import fp8_rows, q4_k_rows, q8_0_rows
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((40, 512)) * np.exp2(rng.integers(-24, 6, (40, 512)))).astype(np.float32)
    w[0, :128] = 0.0
    w[1, :7] = -0.0
    w[2, :128] = np.float32(448.0) * np.arange(128) / 127  # every e4m3 step, ties included
    np.testing.assert_array_equal(q8_0_rows(w), gguf.quants.quantize(w, Q.Q8_0))
    np.testing.assert_array_equal(fp8_rows(w), rows(*quantize_rows(w)))
    w[3, :256] = 0.5  # a constant super-block: zero steps
    w[4, :32] = -np.arange(32, dtype=np.float32)  # a sub-block below zero: its min is the offset
    np.testing.assert_array_equal(q4_k_rows(w), _q4_k(w.reshape(-1, 256)).reshape(40, -1))


def test_int8_prefill_is_w8a8(case):
    """The int8 dense path: rows of x and W quantized per row (int8, scale max/127), their int32 sums scaled back;
    within W8A8's rounding of the float64 product, and exactly the numpy model of those steps."""
    from cpu_kernels.quant import int8_gemm
    t, cases = case
    for N, K, w, raw, deq in cases[:2]:
        lin = QuantLinear.from_raw(t, raw, (N, K))
        x = np.random.default_rng(9).standard_normal((GEMV_MAX_M + 7, K)).astype(np.float32)
        got = lin.matmul(x, dense_dtype="int8")
        assert rel_err(got, x.astype(np.float64) @ deq.astype(np.float64).T) < 3e-2, t.name
        xq, sx = int8_gemm.quantize_rows(x)
        wq, sw = lin.int8_rows()
        assert np.abs(xq).max() <= 127 and np.allclose(xq * sx[:, None], x, atol=float(sx.max()) / 2 + 1e-7)
        acc = xq.astype(np.int64) @ wq.astype(np.int64).T
        want = (acc.astype(np.float32) * (sx[:, None] * sw[None, :])).astype(np.float32)
        np.testing.assert_array_equal(got, want)


def test_bf16_conversions_are_torchs():
    """The bf16 GEMM's input rounding and output widening (+ bias) on every core: the bits of torch's .to(bfloat16),
    copy_ and numpy's add."""
    import torch

    from cpu_kernels.quant import bf16_io
    x = (np.random.default_rng(2).standard_normal((70, 600)) * 5).astype(np.float32)
    x[0, :3] = [1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -0.0]  # ties round to even
    want = torch.from_numpy(x).to(torch.bfloat16)
    np.testing.assert_array_equal(bf16_io.to_bf16(x), want.view(torch.int16).numpy().view(np.uint16))
    y = np.zeros((80, 700), np.float32)
    bias = np.random.default_rng(3).standard_normal(700).astype(np.float32)
    bf16_io.from_bf16(want.view(torch.int16).numpy().view(np.uint16), y, 5, 50, bias)
    np.testing.assert_array_equal(y[5:75, 50:650], want.float().numpy() + bias[50:650])
    assert not y[:5].any() and not y[:, :50].any() and not y[75:].any()
