"""Compile (or load from Numba's cache) every non-matmul kernel for the argument types the model uses."""
from __future__ import annotations

import numpy as np

from cpu_kernels import activations, attention, mla, moe, norms, rope, token_mask
from cpu_kernels.attn_inputs import attn_inputs, q_inputs, sigmoid_gate
from cpu_kernels.delta_net import gdn_core
from cpu_kernels.rope import RopeScaling
from cpu_kernels.kv_rows import STORAGES, zeros_cache


def warmup(kv_storages=("float16", "float32")) -> None:
    """Calls each kernel once on tiny shapes, on its serial and its parallel path, for each KV storage (kv_spec's
    names).

    Types match the callers: float32 C-contiguous activations, int64 positions and slots, int32 batch
    tables, Python floats/ints/bools for scalars (rms_norm with and without unit_offset given).
    """
    f32 = np.float32
    x = np.ones((20, 8), f32)
    w = np.ones(8, f32)
    w_file = w.copy()
    w_file.flags.writeable = False  # a norm weight read straight from the model file's memory map
    for rows in (x[:1], x):
        for weight in (w, w_file):
            norms.rms_norm(rows, weight, 1e-6)
            norms.rms_norm(rows, weight, 1e-6, True)
    none = np.empty(0, f32)
    for rows in (x[:1], x):
        for post, nxt in ((w, w), (w, none), (none, w)):
            norms.residual_rms_norm(rows, rows, post, nxt, 1e-6, 1e-6)
    for rows in (x[:1, :4], x[:, :4]):  # a strided view: MLA's q_a columns beside kv_a's in one output
        norms.rms_norm(rows, w[:4], 1e-6)
    norms.rms_norm_heads(x.reshape(20, 2, 4), w[:4], 1e-6)
    norms.rms_norm_heads(x.reshape(20, 2, 4), w[:4], 1e-6, True)

    inv_freq, mscale = rope.rope_inv_freq(8, 10000.0, RopeScaling())
    for t in (1, 20):
        q = np.ones((t, 2, 8), f32)
        cos, sin = rope.rope_cos_sin(np.arange(t, dtype=np.int64), inv_freq, mscale)  # the model's calls
        for neox in (True, False):
            rope.rotate(q, cos, sin, neox)

    for gate in (np.ones((1, 8), f32), np.ones((8, 4096), f32)):
        activations.silu_mul(gate, gate)
        activations.gelu_tanh_mul(gate, gate)
        activations.softcap(gate.copy(), 30.0)
        activations._swiglu_oai(gate, 0, gate, 0, gate.shape[1])  # gpt-oss's experts call the kernel itself

    logits = np.ones((3, 8), f32)  # MoE routing (both paths' kernels): biases made here or read from the file
    for bias in (w, w_file):
        moe.expert_rows(logits, bias, 2, moe.SIGMOID, 4, 2, True, 2.5)
        moe.add_shared(logits.copy(), logits, bias, logits)

    token_mask.apply_token_bitmask(np.zeros((2, 40), f32), np.array([1]), np.ones((1, 2), np.int32))  # grammars

    ids, weights = moe.expert_rows(x, none, 2, moe.SOFTMAX, 1, 1, True, 1.0)  # Gemma 4's router input and scales
    moe.scale_chosen(ids, weights, w)
    moe.router_input(x, w, 1e-6, 0.5)

    hq, hkv, bs = 4, 2, 4
    slots = np.array([1, 7, 8], np.int64)
    decode = (np.array([0, 1], np.int32), np.array([2], np.int32), np.array([[0, 0]], np.int32))
    mixed = (np.array([0, 1, 3], np.int32), np.array([2, 5], np.int32), np.array([[0, 0], [1, 2]], np.int32))
    for storage in kv_storages:
        d = 32 if storage == "q8_0" else 8  # q8_0 rows are whole blocks of 32
        w = np.ones(d, f32)
        inv_freq, mscale = rope.rope_inv_freq(d, 10000.0, RopeScaling())
        k = np.ones((3, hkv, d), f32)
        k_cache = zeros_cache(3, bs, hkv, d, storage)
        v_cache = np.zeros_like(k_cache)
        attention.write_kv(k, k, k_cache, v_cache, slots)
        for t in (1, 20):  # the serial and the parallel path
            y = np.ones((t, (hq + 2 * hkv) * d), f32)
            cos, sin = rope.rope_cos_sin(np.arange(t, dtype=np.int64), inv_freq, mscale)
            attn_inputs((y, 0), (y, hq * d), (y, (hq + hkv) * d), hq, (w, 1e-6), (w, 1e-6), cos, sin, True,
                        k_cache, v_cache, np.arange(t, dtype=np.int64) % (3 * bs), v_norm=(w, 1e-6))  # V normed
            q_inputs((y, 0), hq, d, (w, 1e-6), cos, sin, True)  # a layer reading another layer's K/V
            sigmoid_gate(np.ones((t, 2, d), f32), (y, d), 2 * d)  # qwen3.5's gated attention
        latent = zeros_cache(3, bs, 1, 2 * d, storage)  # MLA: [latent (d) | rope key (d)], K read as V
        for t in (1, 20):
            y = np.ones((t, 2 * hq * d + 2 * d), f32)
            cos, sin = rope.rope_cos_sin(np.arange(t, dtype=np.int64), inv_freq, mscale)
            mla.write_latents((y, 2 * hq * d), (w, 1e-6), cos, sin, latent, np.arange(t, dtype=np.int64) % (3 * bs))
            q = np.zeros((t, hq, 2 * d), f32)
            mla.rope_queries(y, 0, 2 * d, cos, sin, q)
            mla.head_columns(y, 0, hq, 2 * d, d)
        for qsl, seq_lens, block_tables in (decode, mixed):
            q = np.ones((qsl[-1], hq, d), f32)
            kv = (attention._kernel_view(k_cache), attention._kernel_view(v_cache), qsl, seq_lens, block_tables)
            for scale, window, cap in ((0.5, 0, 0.0), (0.5, 2, 30.0)):  # both variants, whatever the thread count
                attention._paged_attention(q, *kv, scale, window, cap, 2, attention._NO_BF16, attention.NO_SINKS)
                attention._paged_attention_serial(q, *kv, scale, window, cap, attention._NO_BF16, attention.NO_SINKS)
    warm_delta_net()


def warm_delta_net() -> None:
    """gdn_core (qwen3.5's linear attention) on its serial and parallel paths, token by token and chunked, with a
    snapshot; argument types as parts/delta_net.py passes them."""
    f32, i32 = np.float32, np.int32
    hk, hv, dk, dv, k = 1, 2, 4, 4, 4
    c = 2 * hk * dk + hv * dv
    w, vec, norm_w = np.ones((k, c), f32), -np.ones(hv, f32), np.ones(dv, f32)
    conv_pool, ssm_pool = np.zeros((3, k - 1, c), f32), np.zeros((3, hv, dk, dv), f32)
    for t, chunk_min in ((1, 64), (70, 64), (3, 0)):
        y = np.ones((t, c + hv * dv + 2 * hv), f32)
        qsl, pos = np.array([0, t], i32), np.arange(t, dtype=np.int64)
        for par in (False, True):
            gdn_core((y, 0), (y, c), (y, c + hv * dv), (y, c + hv * dv + hv), w, vec, vec.copy(), norm_w, 1e-6,
                     conv_pool, ssm_pool, qsl, pos, np.array([1], i32), np.array([t], i32), np.array([2], i32),
                     hk, dk, dv, chunk_min, par)


def main(argv=None) -> None:
    """`python -m cpu_kernels.warmup --kv-dtype float16`: the cold-cache helper of cpu_kernels/prewarm.py."""
    import argparse

    from cpu_kernels import prewarm
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--kv-dtype", default="float16", choices=STORAGES)
    storage = ap.parse_args(argv).kv_dtype
    warmup(kv_storages=(storage,))
    prewarm.mark_done(prewarm.kernels_name(storage))


if __name__ == "__main__":
    main()
