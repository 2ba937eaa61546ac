"""Write an FP8 HF folder of a real llama shape (quant_method fp8, 128x128 weight_scale_inv, as Qwen3.x-FP8 and
DeepSeek-V3 ship), random weights, with a word-level tokenizer, loadable by ramlm:

    python -m bench.make_synthetic_fp8 --shape llama-8b --out /tmp/llama8b-fp8

--dtype bf16 writes the same folder unquantized (bf16 linear layers, no quantization_config): the source that vLLM's
quantization argument (`--quantization q4_k` etc.) quantizes at load.

The e4m3 bytes are a gaussian's FP8 codes (a table tiled from a random offset per tensor, so writing 8 GB takes
seconds); norms, embeddings and lm_head are bf16, as in the published checkpoints. Compare its decode with ramlm on
the Q8_0 GGUF of the same shape (bench.make_synthetic --quant q8_0) and its prefill with llama.cpp's on that file.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from bench.make_synthetic import SHAPES

SHARD_LAYERS = 4


def _code_table(rng: np.random.Generator) -> np.ndarray:
    from cpu_kernels.quant.fp8_quant import to_e4m3
    g = rng.standard_normal(1 << 22).astype(np.float32)
    return to_e4m3(np.clip(g / np.abs(g).max() * 448.0, -448, 448))


def _fp8(rng, table, shape) -> tuple:
    import torch
    n = int(np.prod(shape))
    q = np.resize(np.roll(table, int(rng.integers(len(table)))), n).reshape(shape)
    scale = (rng.random((-(-shape[0] // 128), -(-shape[1] // 128)), dtype=np.float32) + 0.5) * np.float32(0.02 / 100)
    return torch.from_numpy(q).view(torch.float8_e4m3fn), torch.from_numpy(scale)


def _bf16(rng, shape, mean=0.0, std=0.02):
    import torch
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * std + mean).to(torch.bfloat16)


def _bf16_tiled(rng, bits, shape):
    import torch
    tiled = np.resize(np.roll(bits, int(rng.integers(len(bits)))), int(np.prod(shape))).reshape(shape)
    return torch.from_numpy(tiled).view(torch.bfloat16)


def hf_config(s: dict, fp8: bool = True) -> dict:
    if s["arch"] != "llama":
        raise SystemExit(f"make_synthetic_fp8 writes llama shapes only (got {s['arch']})")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": s["vocab_size"],
            "hidden_size": s["hidden_size"], "intermediate_size": s["intermediate_size"],
            "num_hidden_layers": s["num_layers"], "num_attention_heads": s["num_heads"],
            "num_key_value_heads": s["num_kv_heads"], "head_dim": s["head_dim"], "rope_theta": s["rope_theta"],
            "rms_norm_eps": s["rms_norm_eps"], "max_position_embeddings": s["max_position_embeddings"],
            "tie_word_embeddings": False, "bos_token_id": 2, "eos_token_id": 1, "torch_dtype": "bfloat16",
            **({"quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                        "weight_block_size": [128, 128]}} if fp8 else {})}


def write_tokenizer(out: str, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "t2", "eos_token": "t1", "unk_token": "t0"}, f)


def write(shape: str, out: str, seed: int = 0, dtype: str = "fp8") -> None:
    import torch
    from safetensors.torch import save_file
    s = SHAPES[shape]
    H, I, L = s["hidden_size"], s["intermediate_size"], s["num_layers"]
    q_rows, kv_rows = s["num_heads"] * s["head_dim"], s["num_kv_heads"] * s["head_dim"]
    rng = np.random.default_rng(seed)
    fp8 = dtype == "fp8"
    # bf16: a gaussian's bf16 bits tiled from a random offset per tensor, as the e4m3 codes (seconds, not minutes)
    table = _code_table(rng) if fp8 else _bf16(rng, (1 << 22,)).view(torch.int16).numpy()
    os.makedirs(out, exist_ok=True)
    weight_map = {}

    def save(tensors: dict, name: str) -> None:
        save_file(tensors, os.path.join(out, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})

    save({"model.embed_tokens.weight": _bf16(rng, (s["vocab_size"], H)), "model.norm.weight": _bf16(rng, (H,), 1.0),
          "lm_head.weight": _bf16(rng, (s["vocab_size"], H))}, "model-embed.safetensors")
    for first in range(0, L, SHARD_LAYERS):
        tensors = {}
        for i in range(first, min(L, first + SHARD_LAYERS)):
            p = f"model.layers.{i}."
            for name, shp in (("self_attn.q_proj", (q_rows, H)), ("self_attn.k_proj", (kv_rows, H)),
                              ("self_attn.v_proj", (kv_rows, H)), ("self_attn.o_proj", (H, q_rows)),
                              ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)), ("mlp.down_proj", (H, I))):
                if fp8:
                    tensors[p + name + ".weight"], tensors[p + name + ".weight_scale_inv"] = _fp8(rng, table, shp)
                else:
                    tensors[p + name + ".weight"] = _bf16_tiled(rng, table, shp)
            tensors[p + "input_layernorm.weight"] = _bf16(rng, (H,), 1.0)
            tensors[p + "post_attention_layernorm.weight"] = _bf16(rng, (H,), 1.0)
        save(tensors, f"model-layers-{first:03d}.safetensors")
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(s, fp8), f, indent=2)
    write_tokenizer(out, s["vocab_size"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-8b", choices=[k for k, v in SHAPES.items() if v["arch"] == "llama"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["fp8", "bf16"], default="fp8")
    a = ap.parse_args()
    t0 = time.perf_counter()
    write(a.shape, a.out, a.seed, a.dtype)
    print(f"wrote {a.out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
