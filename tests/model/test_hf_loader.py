"""engine/model/hf.py and weights.py: tiny random transformers models saved to tmp folders, read back
under GGUF names and conventions, compared with the torch state_dict after llama.cpp's converter transforms."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from engine.errors import ModelLoadError  # noqa: E402
from engine.model.hf import open_hf, permute_qk  # noqa: E402
from engine.model.hf_config import config_from_hf  # noqa: E402
from engine.model.weights import open_weights  # noqa: E402

SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _configs():
    T = transformers
    return {
        "llama": T.LlamaConfig(**SMALL, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128}),
        "mistral": T.MistralConfig(**SMALL, sliding_window=64, head_dim=8),
        "qwen2": T.Qwen2Config(**SMALL),
        "qwen3": T.Qwen3Config(**SMALL, head_dim=16),
        "gemma3": T.Gemma3TextConfig(**{**SMALL, "num_hidden_layers": 7}, head_dim=16, sliding_window=32,
                                     query_pre_attn_scalar=16),
        "qwen3moe": T.Qwen3MoeConfig(**SMALL, head_dim=8, moe_intermediate_size=16, num_experts=4,
                                     num_experts_per_tok=2, norm_topk_prob=True),
    }


_BUILT: dict = {}


def build(tmp_path_factory, kind: str, dtype: str):
    """(folder, state_dict as float32 tensors, hf config) of a tiny random model saved in `dtype`."""
    key = (kind, dtype)
    if key not in _BUILT:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(_configs()[kind])
        with torch.no_grad():  # make norms non-trivial so +1 and mapping mistakes show
            for n, p in model.named_parameters():
                if p.ndim == 1:
                    p.copy_(torch.randn_like(p))
        if dtype == "bf16":
            model = model.to(torch.bfloat16)
        folder = tmp_path_factory.mktemp(f"{kind}_{dtype}")
        model.save_pretrained(folder)
        sd = {k: v.detach().float() for k, v in model.state_dict().items()}
        _BUILT[key] = (folder, sd, model.config)
    return _BUILT[key]


def as_f32(ws, name) -> np.ndarray:
    raw, t = ws.raw(name), ws.info(name).ggml_type
    if t == GT.BF16:
        assert raw.dtype == np.uint16
        return (raw.astype(np.uint32) << 16).view(np.float32)
    assert raw.dtype == {GT.F32: np.float32, GT.F16: np.float16}[t]
    return raw.astype(np.float32)


def expected(kind: str, sd: dict, cfg) -> dict[str, np.ndarray]:
    """GGUF name -> float32 values, written out independently of engine/model/hf.py."""
    gemma = kind == "gemma3"
    per_layer = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                 "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
                 "post_attention_layernorm": "post_attention_norm" if gemma else "ffn_norm",
                 "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
                 "mlp.gate": "ffn_gate_inp"}
    out: dict[str, np.ndarray] = {}
    for k, v in sd.items():
        a = v.numpy()
        if k == "model.embed_tokens.weight":
            out["token_embd.weight"] = a
        elif k == "model.norm.weight":
            out["output_norm.weight"] = a + 1 if gemma else a
        elif k == "lm_head.weight":
            if not cfg.tie_word_embeddings:
                out["output.weight"] = a
        elif ".mlp.experts." in k:  # transformers 5 keeps experts fused in memory
            i = k.split(".")[2]
            if k.endswith("gate_up_proj"):
                half = a.shape[1] // 2
                out[f"blk.{i}.ffn_gate_exps.weight"] = a[:, :half]
                out[f"blk.{i}.ffn_up_exps.weight"] = a[:, half:]
            else:
                out[f"blk.{i}.ffn_down_exps.weight"] = a
        else:
            _, _, i, *mid, suffix = k.split(".")
            base = per_layer[".".join(mid)]
            if kind in ("llama", "mistral") and base in ("attn_q", "attn_k"):
                n = cfg.num_attention_heads if base == "attn_q" else cfg.num_key_value_heads
                a = a.reshape(n, 2, a.shape[0] // n // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
            if gemma and base.endswith("norm"):
                a = a + 1
            out[f"blk.{i}.{base}.{suffix}"] = a
    return out


KINDS = ["llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen3moe"]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
def test_names_and_values(tmp_path_factory, kind, dtype):
    folder, sd, cfg = build(tmp_path_factory, kind, dtype)
    ws = open_weights(folder)
    assert ws.format == "hf" and ws.path == str(folder)
    want = expected(kind, sd, cfg)
    assert sorted(ws.names()) == sorted(want)
    for name, a in want.items():
        info = ws.info(name)
        assert info.shape == a.shape, name
        is_norm = kind == "gemma3" and name.endswith("norm.weight")
        assert info.ggml_type == (GT.F32 if dtype == "f32" or is_norm else GT.BF16), name
        got = as_f32(ws, name)
        if is_norm and dtype == "bf16":  # +1 done in f32, as the converter does
            np.testing.assert_allclose(got, a, rtol=0, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(got, a, err_msg=name)
    plain = ws.raw("blk.0.attn_v.weight")  # untouched tensors are views of the map
    assert not plain.flags.owndata and not plain.flags.writeable
    assert ws.unmapped == []


@pytest.mark.parametrize("kind", KINDS)
def test_config_matches_hf(tmp_path_factory, kind):
    folder, sd, cfg = build(tmp_path_factory, kind, "f32")
    c = open_weights(folder).config
    arch = {"mistral": "llama", "qwen3moe": "qwen3moe"}.get(kind, kind)
    assert c.arch == arch and c.vocab_size == 96 and c.hidden_size == 32
    assert (c.num_layers, c.num_heads, c.num_kv_heads) == (cfg.num_hidden_layers, 4, 2)
    assert c.head_dim == (getattr(cfg, "head_dim", None) or 32 // 4)
    assert c.rope_neox == (arch != "llama")
    assert c.tie_word_embeddings == bool(cfg.tie_word_embeddings)
    if kind == "llama":
        rs = c.rope_scaling
        assert (rs.type, rs.factor, rs.original_max_position, rs.low_freq_factor, rs.high_freq_factor) == (
            "llama3", 8.0, 128, 1.0, 4.0)
    if kind == "mistral":
        assert c.layer_sliding_window == (64, 64)
    if kind == "gemma3":
        assert c.hidden_act == "gelu_tanh" and c.attn_scale == pytest.approx(0.25)
        assert c.layer_sliding_window == (32, 32, 32, 32, 32, 0, 32)
        assert c.rope_theta == 1e6 and c.rope_theta_local == 10000.0 and c.tie_word_embeddings
    if kind == "qwen3moe":
        assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (4, 2, 16)
        assert c.norm_topk_prob


def test_permutation_turns_neox_pairs_into_adjacent_pairs():
    """HF llama ropes pairs (i, i + D/2) on its q; on permuted rows, pairs (2i, 2i+1) give the same
    numbers in permuted order -- which is why llama runs 'normal' rope on GGUF weights."""
    rng = np.random.default_rng(0)
    n_head, d, k, pos = 2, 8, 5, 7
    w, x = rng.standard_normal((n_head * d, k)), rng.standard_normal(k)
    theta = pos * 10000.0 ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(theta), np.sin(theta)
    q = (w @ x).reshape(n_head, d)
    x1, x2 = q[:, : d // 2], q[:, d // 2:]
    hf = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=1)
    qp = (permute_qk(w, n_head) @ x).reshape(n_head, d)
    a, b = qp[:, 0::2], qp[:, 1::2]
    normal = np.stack([a * cos - b * sin, b * cos + a * sin], axis=2).reshape(n_head, d)
    np.testing.assert_allclose(permute_qk(hf.reshape(n_head * d, 1), n_head).reshape(n_head, d), normal)


def test_sharded_folder(tmp_path_factory):
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(_configs()["qwen3"])
    folder = tmp_path_factory.mktemp("sharded")
    model.save_pretrained(folder, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").exists()
    ws = open_hf(folder)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    want = expected("qwen3", sd, model.config)
    assert sorted(ws.names()) == sorted(want)
    for name, a in want.items():
        np.testing.assert_array_equal(as_f32(ws, name), a)


def test_fused_experts_checkpoint(tmp_path_factory):
    """A checkpoint saved in transformers 5's in-memory layout (experts.gate_up_proj / down_proj)."""
    folder, sd, cfg = build(tmp_path_factory, "qwen3moe", "f32")
    fused = tmp_path_factory.mktemp("fused")
    (fused / "config.json").write_text((folder / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in sd.items()}, str(fused / "model.safetensors"))
    ws = open_hf(fused)
    want = expected("qwen3moe", sd, cfg)
    assert sorted(ws.names()) == sorted(want)
    for name, a in want.items():
        np.testing.assert_array_equal(as_f32(ws, name), a, err_msg=name)


def test_multimodal_gemma3_checkpoint(tmp_path_factory):
    """Gemma3ForConditionalGeneration layout: text weights under model.language_model., vision skipped."""
    folder, sd, cfg = build(tmp_path_factory, "gemma3", "f32")
    mm = tmp_path_factory.mktemp("gemma3mm")
    text_cfg = json.loads((folder / "config.json").read_text())
    (mm / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text_cfg,
                                                "vision_config": {"hidden_size": 8}}))
    renamed = {k.replace("model.", "model.language_model.", 1): v.contiguous() for k, v in sd.items()
               if k != "lm_head.weight"}
    renamed["model.vision_tower.patch_embedding.weight"] = torch.zeros(4, 4)
    save_file(renamed, str(mm / "model.safetensors"))
    ws = open_hf(mm)
    want = expected("gemma3", sd, cfg)
    assert sorted(ws.names()) == sorted(want) and ws.config.arch == "gemma3"
    assert ws.unmapped == ["model.vision_tower.patch_embedding.weight"]
    for name, a in want.items():
        np.testing.assert_array_equal(as_f32(ws, name), a, err_msg=name)


def test_tied_llama_drops_lm_head(tmp_path_factory):
    torch.manual_seed(2)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**SMALL, tie_word_embeddings=True))
    folder = tmp_path_factory.mktemp("tied")
    model.save_pretrained(folder)
    ws = open_hf(folder)
    assert ws.config.tie_word_embeddings and "output.weight" not in ws.names()


# --------------------------------------------------------------------------------------- config.json dicts

BASE = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 100}


def test_config_rope_variants_v4_style():
    c = config_from_hf({**BASE, "model_type": "llama", "rope_theta": 5e5, "rope_scaling": {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, "eos_token_id": [1, 2]})
    assert c.rope_theta == 5e5 and c.rope_scaling.type == "llama3" and c.rope_scaling.factor == 32.0
    assert c.eos_token_ids == (1, 2) and c.head_dim == 16 and not c.rope_neox
    c = config_from_hf({**BASE, "model_type": "qwen2", "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                                         "original_max_position_embeddings": 32768}})
    assert (c.rope_scaling.type, c.rope_scaling.factor, c.rope_scaling.original_max_position) == ("yarn", 4.0, 32768)
    assert c.rope_scaling.attn_factor == 1.0
    c = config_from_hf({**BASE, "model_type": "qwen3", "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert (c.rope_scaling.type, c.rope_scaling.factor) == ("linear", 2.0)
    with pytest.raises(ModelLoadError, match="dynamic"):
        config_from_hf({**BASE, "model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 2.0}})


def test_config_sliding_windows():
    c = config_from_hf({**BASE, "model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False})
    assert c.layer_sliding_window == ()
    c = config_from_hf({**BASE, "model_type": "qwen2", "sliding_window": 16, "use_sliding_window": True,
                        "max_window_layers": 2})
    assert c.layer_sliding_window == (0, 0, 16, 16)
    c = config_from_hf({**BASE, "model_type": "mistral", "sliding_window": None})
    assert c.layer_sliding_window == ()


def test_config_gemma3_multimodal_v4_style():
    c = config_from_hf({"model_type": "gemma3", "eos_token_id": [1, 106], "text_config": {
        **BASE, "num_hidden_layers": 12, "model_type": "gemma3_text", "head_dim": 32, "num_key_value_heads": 2,
        "query_pre_attn_scalar": 144, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "sliding_window": 8,
        "sliding_window_pattern": 6, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}, "vision_config": {}})
    assert c.arch == "gemma3" and c.num_layers == 12 and c.head_dim == 32 and c.num_kv_heads == 2
    assert c.attn_scale == pytest.approx(144 ** -0.5) and c.eos_token_ids == (1, 106)
    assert c.layer_sliding_window == (8, 8, 8, 8, 8, 0) * 2
    assert (c.rope_scaling.type, c.rope_scaling.factor, c.rope_theta_local) == ("linear", 8.0, 1e4)
    assert c.final_logit_softcap == 30.0 and c.attn_logit_softcap == 50.0 and c.tie_word_embeddings


def test_config_errors():
    with pytest.raises(ModelLoadError, match="'gpt2' is not supported.*llama"):
        config_from_hf({**BASE, "model_type": "gpt2"})
    with pytest.raises(ModelLoadError, match="hidden_size"):
        config_from_hf({k: v for k, v in BASE.items() if k != "hidden_size"} | {"model_type": "llama"})


# --------------------------------------------------------------------------------------- bad folders

def _folder(tmp_path, config=None):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config or {**BASE, "model_type": "llama"}))
    return tmp_path


def test_bad_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="nothing-here"):
        open_weights(tmp_path / "nothing-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        open_weights(tmp_path / "empty")
    (tmp_path / "x.bin").write_bytes(b"\0" * 64)
    with pytest.raises(ModelLoadError, match="x.bin"):
        open_weights(tmp_path / "x.bin")
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        open_weights(_folder(tmp_path / "nost"))


def test_corrupt_safetensors(tmp_path):
    cases = {
        "hugelen": struct.pack("<Q", 2**40) + b"{}",
        "notjson": struct.pack("<Q", 4) + b"{{{{",
        "outside": _st_bytes({"model.embed_tokens.weight": {"dtype": "F32", "shape": [100, 64],
                                                            "data_offsets": [0, 25600]}}, 16),
        "badsize": _st_bytes({"model.embed_tokens.weight": {"dtype": "F32", "shape": [2, 2],
                                                            "data_offsets": [0, 8]}}, 8),
        "short": b"\1\2",
    }
    for name, data in cases.items():
        folder = _folder(tmp_path / name)
        (folder / "model.safetensors").write_bytes(data)
        with pytest.raises(ModelLoadError, match="model.safetensors"):
            open_weights(folder)
    folder = _folder(tmp_path / "i64")
    (folder / "model.safetensors").write_bytes(_st_bytes(
        {"model.embed_tokens.weight": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, 8))
    with pytest.raises(ModelLoadError, match="model.embed_tokens.weight.*I64"):
        open_weights(folder)
    folder = _folder(tmp_path / "index")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
    with pytest.raises(ModelLoadError, match="gone.safetensors"):
        open_weights(folder)


def _st_bytes(header: dict, data_len: int) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + b"\0" * data_len
