"""Write a GGUF file from GGUF-named float tensors and a ModelConfig (tests and bench writers use it)."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import gguf
import numpy as np

from engine.model.config import ModelConfig

Q = gguf.GGMLQuantizationType
# Tensors llama.cpp's converter always writes in F32 whatever the scheme (ggml_ssm_conv reads an F32 kernel).
F32_TENSORS = ("ssm_conv1d.weight", "ssm_a", "ssm_dt.bias")


def default_qtype(quant: Q) -> Callable[[str, tuple], Q]:
    """2-D weights whose rows fit the format's block get `quant`; norms, biases and the rest stay F32."""
    block = gguf.GGML_QUANT_SIZES[quant][0]

    def pick(name: str, shape: tuple) -> Q:
        if len(shape) >= 2 and name.endswith(".weight") and shape[-1] % block == 0 and "ffn_gate_inp" not in name:
            return quant
        return Q.F32
    return pick


def gguf_metadata(cfg: ModelConfig) -> dict[str, Any]:
    """The keys llama.cpp reads for cfg (with the `{arch}.` prefix, tokenizer.* keys without; ints are written uint32,
    floats float32): those every architecture shares, then the architecture's own (Architecture.gguf_metadata), which
    may replace some."""
    from engine.model.registry import architecture
    md: dict[str, Any] = {
        "context_length": cfg.max_position_embeddings, "embedding_length": cfg.hidden_size,
        "block_count": cfg.num_layers + cfg.nextn_layers,  # llama.cpp counts the MTP layers
    }
    if cfg.nextn_layers:
        md["nextn_predict_layers"] = cfg.nextn_layers
    md.update({"feed_forward_length": cfg.intermediate_size, "attention.head_count": cfg.num_heads,
               "attention.head_count_kv": cfg.num_kv_heads, "attention.key_length": cfg.head_dim,
               "attention.value_length": cfg.head_dim,
               "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), "rope.freq_base": float(cfg.rope_theta),
               "rope.dimension_count": cfg.rope_dim or cfg.head_dim})
    rs = cfg.rope_scaling
    if rs.type not in ("none", "llama3"):  # llama3 travels as the rope_freqs.weight tensor
        md["rope.scaling.type"] = rs.type
        md["rope.scaling.factor"] = float(rs.factor)
        if rs.original_max_position:
            md["rope.scaling.original_context_length"] = rs.original_max_position
        if rs.type == "yarn":
            md["rope.scaling.yarn_beta_fast"] = float(rs.beta_fast)
            md["rope.scaling.yarn_beta_slow"] = float(rs.beta_slow)
    windows = [x for x in cfg.layer_sliding_window if x]
    if windows:
        md["attention.sliding_window"] = windows[0]
    if cfg.final_logit_softcap:
        md["final_logit_softcapping"] = float(cfg.final_logit_softcap)
    if cfg.attn_logit_softcap:
        md["attn_logit_softcapping"] = float(cfg.attn_logit_softcap)
    if cfg.num_experts:
        md.update({"expert_count": cfg.num_experts, "expert_used_count": cfg.num_experts_per_tok,
                   "expert_feed_forward_length": cfg.moe_intermediate_size,
                   "expert_weights_norm": bool(cfg.norm_topk_prob)})
        if cfg.expert_gating in ("softmax", "sigmoid"):  # gpt-oss's topk_softmax is its architecture's own
            md["expert_gating_func"] = {"softmax": 1, "sigmoid": 2}[cfg.expert_gating]
        if cfg.expert_shared_count:
            md["expert_shared_count"] = cfg.expert_shared_count
        if cfg.expert_weights_scale != 1.0:
            md["expert_weights_scale"] = float(cfg.expert_weights_scale)
        if cfg.expert_group_count > 1:
            md["expert_group_count"] = cfg.expert_group_count
            md["expert_group_used_count"] = cfg.expert_group_used_count
        if cfg.dense_layers and cfg.dense_layers == tuple(range(len(cfg.dense_layers))):
            md["leading_dense_block_count"] = len(cfg.dense_layers)
    md.update(architecture(cfg.arch).gguf_metadata(cfg))
    return {k if k.startswith("tokenizer.") else f"{cfg.arch}.{k}": v for k, v in md.items()}


def write_metadata(w: gguf.GGUFWriter, cfg: ModelConfig) -> None:
    w.add_name(cfg.name or cfg.arch)
    for key, value in gguf_metadata(cfg).items():
        _add_kv(w, key, value)


def write_gguf(path: str, cfg: ModelConfig, tensors: Mapping[str, np.ndarray],
               qtype: Callable[[str, tuple], Q] | None = None, tokenizer_metadata: Mapping | None = None,
               quantized: Mapping[str, tuple[Q, np.ndarray]] | None = None) -> None:
    """tensors: GGUF name -> float array in numpy order (N, K); each is quantized to qtype(name, shape).
    quantized: GGUF name -> (type, raw uint8 (..., row bytes)) written as they are (an HF MXFP4 checkpoint's
    experts)."""
    from cpu_kernels.quant.quantize import quantize
    qtype = qtype or (lambda name, shape: Q.F32)
    w = gguf.GGUFWriter(path, cfg.arch)
    write_metadata(w, cfg)
    for key, value in (tokenizer_metadata or {}).items():
        _add_kv(w, key, value)
    tensors = dict(tensors)
    if cfg.rope_scaling.type == "llama3" and "rope_freqs.weight" not in tensors:
        tensors["rope_freqs.weight"] = llama3_rope_freqs(cfg)
    from engine.model.registry import architecture
    for name, t in architecture(cfg.arch).gguf_tensors(cfg).items():  # what llama.cpp's converter computes
        tensors.setdefault(name, t)
    for name, (q, raw) in (quantized or {}).items():
        w.add_tensor(name, np.ascontiguousarray(raw, dtype=np.uint8), raw_dtype=q)
    for name, t in tensors.items():
        if quantized and name in quantized:
            continue
        t = np.ascontiguousarray(t, dtype=np.float32)
        q = Q.F32 if name.endswith(F32_TENSORS) else qtype(name, t.shape)
        if not isinstance(q, Q):
            raise ValueError(f"{name}: {q.name} is ramlm's own weight type; GGUF files hold only GGML's types")
        if q == Q.F32:
            w.add_tensor(name, t)
        elif q == Q.F16:
            w.add_tensor(name, t.astype(np.float16))
        else:
            flat = t.reshape(-1, t.shape[-1])
            raw = quantize(q, flat)
            w.add_tensor(name, raw.reshape(*t.shape[:-1], raw.shape[-1]), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_kv(w: gguf.GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (bytes, bytearray)):  # a uint8 array (tokenizer.ggml.precompiled_charsmap)
        w.add_array(key, bytes(value))
    else:
        w.add_array(key, list(value) if not isinstance(value, list) else value)


def llama3_rope_freqs(cfg: ModelConfig) -> np.ndarray:
    """llama.cpp's rope_freqs.weight: per-frequency divisors that turn plain RoPE into llama3 scaling."""
    from cpu_kernels.rope import rope_inv_freq
    from cpu_kernels.rope import RopeScaling
    plain, _ = rope_inv_freq(cfg.head_dim, cfg.rope_theta, RopeScaling())
    scaled, _ = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    return (np.asarray(plain, np.float64) / np.asarray(scaled, np.float64)).astype(np.float32)
