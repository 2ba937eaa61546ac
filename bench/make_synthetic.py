"""Write a valid GGUF with random weights of a real model's shape, loadable by ramlm and llama.cpp.

    python -m bench.make_synthetic --shape llama-8b --quant q4_k_m --out /tmp/llama8b.gguf
    python -m bench.make_synthetic --shape gpt-oss-20b --quant mxfp4 --out /tmp/gpt-oss-20b.gguf

Quantized tensors are written as random blocks (random quants, small finite fp16 scales) rather than
by quantizing random floats: a 4.6 GiB file then takes seconds, not an hour. The vocabulary is a
synthetic SentencePiece-style one (byte tokens + "tok{i}") so both engines can tokenize.
"""
from __future__ import annotations

import argparse
import os
import time

import gguf
import numpy as np

from cpu_kernels.rope import RopeScaling
from engine.model.config import ModelConfig
from offload.meta import fit_rows

Q = gguf.GGMLQuantizationType

SHAPES = {
    # name: ModelConfig keywords
    "llama-8b": dict(arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                     num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-5,
                     max_position_embeddings=8192),
    "llama-1b": dict(arch="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                     num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=500000.0, rms_norm_eps=1e-5,
                     max_position_embeddings=8192),
    "qwen3-moe-30b-a3b": dict(arch="qwen3moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                              num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128, rope_theta=1e6,
                              rms_norm_eps=1e-6, max_position_embeddings=32768, num_experts=128,
                              num_experts_per_tok=8, moe_intermediate_size=768),
    # gpt-oss-20b (all 24 layers; MXFP4 experts ~10 GiB, the rest Q8_0 as in the published GGUF: ~12 GiB)
    "gpt-oss-20b": dict(arch="gpt-oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_layers=24,
                        num_heads=64, num_kv_heads=8, head_dim=64, rope_theta=150000.0, rms_norm_eps=1e-5,
                        max_position_embeddings=131072, num_experts=32, num_experts_per_tok=4,
                        moe_intermediate_size=2880, norm_topk_prob=False, expert_gating="topk_softmax",
                        layer_sliding_window=tuple(128 if i % 2 == 0 else 0 for i in range(24)),
                        rope_scaling=RopeScaling("yarn", 32.0, 4096, truncate=False), attn_bias=True,
                        attn_out_bias=True),
    # DeepSeek-V3's dims (MLA, 256 experts, YaRN) with 3 of its 61 layers, one dense and two MoE: about 16 GiB
    # in Q4_K_M, so it fits a 24 GiB machine (each MoE layer is ~7.3 GB)
    "deepseek-v3-3l": dict(arch="deepseek2", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                           num_layers=3, num_heads=128, num_kv_heads=1, head_dim=192, value_head_dim=128, rope_dim=64,
                           q_lora_rank=1536, kv_lora_rank=512, rope_theta=10000.0, rms_norm_eps=1e-6,
                           max_position_embeddings=163840,
                           rope_scaling=RopeScaling("yarn", 40.0, 4096, attn_factor=1 / (0.1 * np.log(40.0) + 1)),
                           rope_yarn_log_mul=0.1, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
                           expert_shared_count=1, expert_group_count=8, expert_group_used_count=4,
                           expert_weights_scale=2.5, norm_topk_prob=True, expert_gating="sigmoid",
                           expert_selection_bias=True, dense_layers=(0,)),
    "tiny-deepseek": dict(arch="deepseek2", vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=3,
                          num_heads=4, num_kv_heads=1, head_dim=48, value_head_dim=32, rope_dim=16, q_lora_rank=64,
                          kv_lora_rank=256, rms_norm_eps=1e-6, max_position_embeddings=2048, num_experts=8,
                          num_experts_per_tok=2, moe_intermediate_size=256, expert_shared_count=1,
                          expert_group_count=4, expert_group_used_count=2, expert_weights_scale=2.5,
                          norm_topk_prob=True, expert_gating="sigmoid", expert_selection_bias=True,
                          dense_layers=(0,)),
    # Qwen3.5/3.6: three Gated DeltaNet layers per gated-attention layer. The 35B-A3B's 40 layers are 19.6 GiB in
    # Q4_K_M; 32 of them (15.8 GiB) leave a 24 GiB machine room for the runtime, the states and the KV.
    "qwen3.5-27b": dict(arch="qwen35", vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_layers=64,
                        num_heads=24, num_kv_heads=4, head_dim=256, rope_theta=1e7, rope_dim=64, rms_norm_eps=1e-6,
                        max_position_embeddings=262144, linear_layers=tuple(i for i in range(64) if (i + 1) % 4),
                        ssm_conv_kernel=4, ssm_num_k_heads=16, ssm_num_v_heads=48, ssm_k_head_dim=128,
                        ssm_v_head_dim=128),
    "qwen3.5-35b-a3b-32l": dict(arch="qwen35moe", vocab_size=248320, hidden_size=2048, intermediate_size=0,
                                num_layers=32, num_heads=16, num_kv_heads=2, head_dim=256, rope_theta=1e7, rope_dim=64,
                                rms_norm_eps=1e-6, max_position_embeddings=262144, num_experts=256,
                                num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                                linear_layers=tuple(i for i in range(32) if (i + 1) % 4), ssm_conv_kernel=4,
                                ssm_num_k_heads=16, ssm_num_v_heads=32, ssm_k_head_dim=128, ssm_v_head_dim=128),
    # Gemma 4 26B-A4B: 30 layers (five sliding of 1024 to one full), full layers of 2 kv heads x 512 with V = K's
    # projection and proportional RoPE, a dense MLP beside 128 GELU experts (8 per token). Q4_K_M: ~16 GB, all
    # 30 layers fit a 24 GiB machine.
    "gemma4-26b-a4b": dict(arch="gemma4", vocab_size=262144, hidden_size=2816, intermediate_size=2112, num_layers=30,
                           num_heads=16, num_kv_heads=8, head_dim=256, head_dim_global=512, num_kv_heads_global=2,
                           attn_k_eq_v=True, rope_pairs_global=64, rope_theta=1e6, rope_theta_local=1e4,
                           layer_sliding_window=tuple(0 if (i + 1) % 6 == 0 else 1024 for i in range(30)),
                           final_logit_softcap=30.0, attn_scale=1.0, hidden_act="gelu_tanh", rms_norm_eps=1e-6,
                           max_position_embeddings=262144, tie_word_embeddings=True, num_experts=128,
                           num_experts_per_tok=8, moe_intermediate_size=704),
    # every Gemma 4 feature at once: per-layer embeddings, two KV-shared (double-wide) layers, full layers of their own
    # head_dim with V = K's projection, and the MoE beside the dense MLP
    "tiny-gemma4": dict(arch="gemma4", vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=6,
                        num_heads=4, num_kv_heads=2, head_dim=64, head_dim_global=128, num_kv_heads_global=1,
                        attn_k_eq_v=True, rope_pairs_global=16, rope_theta=1e6, rope_theta_local=1e4,
                        layer_sliding_window=(8, 8, 8, 0, 8, 0), final_logit_softcap=30.0, attn_scale=1.0,
                        hidden_act="gelu_tanh", rms_norm_eps=1e-6, max_position_embeddings=2048,
                        tie_word_embeddings=True, per_layer_input_size=32, kv_shared_layers=2, double_wide_mlp=True,
                        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256),
    "tiny-llama": dict(arch="llama", vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-5, max_position_embeddings=2048),
    "tiny-moe": dict(arch="qwen3moe", vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=64, max_position_embeddings=2048, num_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=256),
}

# Byte offsets of the fp16 scale fields inside one block of each format (the rest may be random).
F16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
              Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.IQ4_NL: (0,),
              Q.IQ4_XS: (0,), Q.IQ2_XXS: (0,), Q.IQ2_XS: (0,), Q.IQ2_S: (0,), Q.IQ3_XXS: (0,), Q.IQ3_S: (0,),
              Q.IQ1_S: (0,), Q.TQ1_0: (52,), Q.TQ2_0: (64,)}
# The spread of a format's values per unit of its fp16 scale, roughly (IQ4_XS: levels ~60 times sub-scales
# ls - 32 ~16; IQ2: points ~25 times (0.5 + ls) / 4 ~2; IQ3_XXS ~30 x 4, IQ3_S ~8 x 16; IQ1 ~0.7 x 7; TQ ~0.7).
SCALE_SPREAD = {Q.IQ4_XS: 1024, Q.IQ2_XXS: 50, Q.IQ2_XS: 50, Q.IQ2_S: 50, Q.IQ3_XXS: 120, Q.IQ3_S: 128,
                Q.IQ1_S: 5, Q.IQ1_M: 5, Q.TQ1_0: 1, Q.TQ2_0: 1}


# preset -> llama.cpp's LLAMA_FTYPE_MOSTLY_* number (general.file_type)
FILE_TYPES = {"q4_k_m": 15, "q8_0": 7, "q4_0": 2, "f16": 1, "mxfp4": 38, "iq4_xs": 30, "iq2_xxs": 19, "iq2_xs": 20,
              "iq3_xxs": 23, "iq1_s": 24, "iq3_s": 26, "iq2_s": 28, "iq1_m": 31, "tq1_0": 36, "tq2_0": 37}
LOW_BIT = ("iq4_xs", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "tq1_0", "tq2_0")


def quant_plan(preset: str):
    """name -> ggml type, like llama.cpp's presets (Q4_K_M keeps attn_v and ffn_down in Q6_K)."""
    def pick(name: str, shape: tuple) -> Q:
        if len(shape) < 2 or "norm" in name or "ffn_gate_inp" in name or name.endswith(".bias") or "ssm_conv1d" in name:
            return Q.F32  # (llama.cpp's converter keeps the conv kernel in F32 too)
        return fit_rows(_preset(name), shape)

    def _preset(name: str) -> Q:
        if preset == "mxfp4":  # llama.cpp's MOSTLY_MXFP4_MOE: MXFP4 experts, Q8_0 elsewhere
            return Q.MXFP4 if "_exps." in name else Q.Q8_0
        if preset == "q8_0":
            return Q.Q8_0
        if preset == "f16":
            return Q.F16
        if preset == "q4_0":
            return Q.Q4_0
        if preset in LOW_BIT:  # llama.cpp's MOSTLY_IQ4_XS etc.: the type throughout, the output matrix in Q6_K
            return Q.Q6_K if name.startswith("output.") else Q[preset.upper()]
        if preset == "q4_k_m":
            if name.startswith("output.") or any(k in name for k in (".attn_v.", "ffn_down")):
                return Q.Q6_K
            return Q.Q4_K
        raise ValueError(f"unknown quant preset {preset!r}; known: {', '.join(FILE_TYPES)}")
    return pick


def random_tensor(rng: np.random.Generator, qtype: Q, shape: tuple, std: float = 0.02) -> np.ndarray:
    """Random data in the on-disk layout of qtype: floats for F32/F16, random blocks otherwise."""
    if qtype == Q.F32:
        return (1.0 + rng.standard_normal(shape, dtype=np.float32) * 0.05 if len(shape) == 1
                else rng.standard_normal(shape, dtype=np.float32) * std)
    if qtype == Q.F16:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[:-1]))
    nblocks = shape[-1] // block
    raw = rng.integers(0, 256, size=(rows * nblocks, size), dtype=np.uint8)
    # Scales: small positive fp16 so that dequantized weights have roughly the asked spread.
    if qtype == Q.MXFP4:  # the E8M0 byte: 2^(120 - 128) times codes of mean magnitude ~5: std ~0.02
        raw[:, 0] = 120
        return raw.reshape(*shape[:-1], nblocks * size)
    if qtype == Q.NVFP4:  # four unsigned-e4m3 scales: 0x10 = 2^-5 / 2, times codes of mean magnitude ~5
        raw[:, :4] = 0x10
        return raw.reshape(*shape[:-1], nblocks * size)
    scale = np.float16(std / SCALE_SPREAD.get(qtype, 8 if block == 256 else 64))
    if qtype == Q.IQ1_M:  # its fp16 d is the top nibbles of the four 16-bit scale words (bytes 49, 51, 53, 55)
        bits = int(scale.view(np.uint16))
        for i in range(4):
            raw[:, 49 + 2 * i] = (raw[:, 49 + 2 * i] & 0x0F) | (((bits >> (4 * i)) & 15) << 4)
        return raw.reshape(*shape[:-1], nblocks * size)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    return raw.reshape(*shape[:-1], nblocks * size)


def synthetic_vocab(n: int) -> dict:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581tok{i}" for i in range(n - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (n - 259)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [float(-i) for i in range(n)], "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": True}


def write_synthetic(path: str, shape: str, quant: str, seed: int = 0, layers: int | None = None) -> ModelConfig:
    """layers: fewer layers than the real model (the name says so), for machines the whole model would not fit."""
    from engine.model.gguf_export import write_metadata
    from engine.model.tensors import tensor_shapes
    kw = dict(SHAPES[shape])
    if layers:
        kw["num_layers"], shape = layers, f"{shape} ({layers} layers)"
        if kw.get("layer_sliding_window"):  # the first layers' windows, the last layer full (as Gemma's configs)
            kw["layer_sliding_window"] = (*kw["layer_sliding_window"][:layers - 1], 0)
    cfg = ModelConfig(**kw, name=f"synthetic {shape} {quant}")
    pick = quant_plan(quant)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, cfg.arch)
    write_metadata(w, cfg)
    vocab = synthetic_vocab(cfg.vocab_size)
    w.add_tokenizer_model(vocab["tokenizer.ggml.model"])
    w.add_token_list(vocab["tokenizer.ggml.tokens"])
    w.add_token_scores(vocab["tokenizer.ggml.scores"])
    w.add_token_types(vocab["tokenizer.ggml.token_type"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_file_type(FILE_TYPES[quant])
    shapes = tensor_shapes(cfg)
    # Tensor infos first (sizes only), then data streamed one tensor at a time to bound memory.
    for name, shp in shapes.items():
        q = pick(name, shp)
        if q in (Q.F32, Q.F16):
            w.add_tensor_info(name, shp, np.dtype(np.float32 if q == Q.F32 else np.float16),
                              int(np.prod(shp)) * (4 if q == Q.F32 else 2))
        else:
            block, size = gguf.GGML_QUANT_SIZES[q]
            nbytes = int(np.prod(shp[:-1])) * (shp[-1] // block) * size
            w.add_tensor_info(name, (*shp[:-1], shp[-1] // block * size), np.dtype(np.uint8), nbytes, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    from engine.model.registry import architecture
    computed = architecture(cfg.arch).gguf_tensors(cfg)  # values llama.cpp's converter computes (rope_freqs)
    for name, shp in shapes.items():
        if name in computed:
            w.write_tensor_data(computed[name])
            continue
        t = random_tensor(rng, pick(name, shp), shp)
        w.write_tensor_data(-t if name.endswith(".ssm_a") else t)  # A = -exp(A_log) < 0: decaying states
    w.close()
    return cfg


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--quant", default="q4_k_m")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape has (to fit in RAM)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    write_synthetic(args.out, args.shape, args.quant, args.seed, args.layers)
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {args.shape} {args.quant}, {size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
