"""Multi-head latent attention (spec.MLASpec) in llama.cpp's absorbed form, over a latent cache: a token's cache row
is [RMSNorm(latent) | roped key] (one kv head of kv_lora_rank + rope dims, K read as V too). Each head's nope query
goes through its attn_k_b into the latent space, so paged attention over the rows gives each head its latent result,
which its attn_v_b takes back to value dims before attn_output. The per-head matrices are stacked tensors (heads,
N, K) run head by head as Linears over views of them (as MoE experts); the steps between are cpu_kernels/mla.py's,
shared with the fused decode step, so both paths give the same bits."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GT

from cpu_kernels import attention, attention_sdpa, mla
from cpu_kernels.quant.linear import QuantLinear, stacked_experts
from cpu_kernels.quant.threads import serial_if, serial_work
from engine.errors import ModelLoadError
from engine.model.parts.attention import rope_tables, step_rope_table
from engine.model.parts.base import Part, packed_linears
from engine.model.parts.linear import Linear, Projections, has
from engine.model.parts.norm import RMSNorm, norm_args, small_on_one_thread
from engine.model.spec import MLASpec


def split_kv_b(w: np.ndarray, num_heads: int, nope: int, value_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's converter split of kv_b_proj (heads * (nope + value_dim), L) into attn_k_b (heads, L, nope) (each
    head's key rows, transposed) and attn_v_b (heads, value_dim, L). Any dtype: data movement only."""
    kvb = w.reshape(num_heads, nope + value_dim, w.shape[-1])
    return np.ascontiguousarray(kvb[:, :nope].transpose(0, 2, 1)), np.ascontiguousarray(kvb[:, nope:])


class MLA(Part):
    def __init__(self, spec: MLASpec, ws, cfg, prefix: str, batch_invariant: bool, shared: dict):
        bi = batch_invariant
        self.q_lora = int(spec.q_lora_rank)
        self.names = {"q": prefix + ("attn_q_a" if self.q_lora else "attn_q") + ".weight",
                      "kv_a": prefix + "attn_kv_a_mqa.weight", "o": prefix + "attn_output.weight"}
        if self.q_lora:
            self.names["q_b"] = prefix + "attn_q_b.weight"
        for k, name in self.names.items():
            setattr(self, k, Linear(ws, name, None, bi))
        eps = cfg.rms_norm_eps
        self.q_a_norm = RMSNorm(ws, prefix + "attn_q_a_norm.weight", eps) if self.q_lora else None
        self.kv_a_norm = RMSNorm(ws, prefix + "attn_kv_a_norm.weight", eps)
        self.num_heads, self.head_dim, self.rope_dim = cfg.num_heads, cfg.head_dim, spec.rope.dim
        self.kv_lora, self.value_dim, self.scale = spec.kv_lora_rank, spec.value_dim, spec.scale
        self.batch_invariant = bi
        self.head_names = {"k_b": prefix + "attn_k_b.weight", "v_b": prefix + "attn_v_b.weight"}
        self.heads = _head_weights(ws, prefix, self.head_names, self.num_heads, self.head_dim - self.rope_dim,
                                   self.value_dim, self.kv_lora)
        # Per head, its k_b and v_b Linears over views of the stacked arrays.
        self.k_b, self.v_b = ([Linear.of(w, None, bi) for w in weights] for _, _, weights in self.heads)
        key = ("rope", spec.rope)
        if key not in shared:
            shared[key] = rope_tables(spec.rope.dim, spec.rope, ws)
        self.inv_freq, self.mscale = shared[key]
        self.proj = Projections(self, ("q", "kv_a"))

    def rope_table(self, meta) -> tuple[np.ndarray, np.ndarray]:
        """cos/sin of the step's positions over the rope dims, shared by the layers with this RoPE."""
        return step_rope_table(meta, self.inv_freq, self.mscale)

    @property
    def cache_dim(self) -> int:
        return self.kv_lora + self.rope_dim

    def __call__(self, x: np.ndarray, meta, kv) -> np.ndarray:
        t, rows, H, L, D = x.shape[0], meta.rows, self.num_heads, self.kv_lora, self.cache_dim
        (yq, q0), kv_cols = self.proj.columns(x, rows)
        if self.q_lora:  # q_a's columns normed (a strided view: rms_norm takes any strides), then q_b
            yq, q0 = self.q_b(self.q_a_norm(yq[:, q0:q0 + self.q_lora]), rows), 0
        cache = kv[0]  # K serves as V: one array
        cos, sin = self.rope_table(meta)
        with small_on_one_thread(kv_cols[0]):
            mla.write_latents(kv_cols, norm_args(self.kv_a_norm), cos, sin, cache, meta.slot_mapping)
        qn = mla.head_columns(yq, q0, H, self.head_dim, self.head_dim - self.rope_dim)
        q = np.empty((t, H, D), np.float32)
        for h in range(H):
            q[:, h, :L] = self.k_b[h](qn[h], rows)
        with small_on_one_thread(yq):
            mla.rope_queries(yq, q0, self.head_dim, cos, sin, q)
        out = self._attend(q, meta, cache, rows, x)
        lat = mla.head_columns(out.reshape(t, H * D), 0, H, D, L)
        v = self.value_dim
        o_in = np.empty((t, H * v), np.float32)
        for h in range(H):
            o_in[:, h * v:(h + 1) * v] = self.v_b[h](lat[h], rows)
        return self.o(o_in, rows)

    def _attend(self, q, meta, cache, rows, x) -> np.ndarray:
        """parts/attention.py's choice of kernel, over the latent cache as both K and V."""
        long_seqs = None if self.batch_invariant or rows is None else rows.bf16_attention(x)
        if long_seqs is not None and attention_sdpa.enabled():
            return attention_sdpa.mixed_attention(q, cache, cache, meta.query_start_loc, meta.seq_lens,
                                                  meta.block_tables, self.scale, 0, long_seqs)
        work = q.shape[0] * meta.max_seq_len * q.shape[1] * q.shape[2]
        with serial_if(work < serial_work()):
            return attention.paged_attention(q, cache, cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                             self.scale, 0, 0.0, long_seqs)

    def fused(self):
        from cpu_kernels.decode_block import FusedMLA
        from cpu_kernels.quant.packed import PACKED, packed
        where = self.proj.where()
        if where is None:
            return None
        (g1, q0), (gkv, kv0) = where
        groups = [lin for lin, _ in self.proj.groups]
        lins = (groups[g1], groups[gkv], self.q_b if self.q_lora else groups[g1], self.o)
        if not packed_linears(lins):
            return None
        (tk, ak, wk), (tv, av, wv) = self.heads
        qn = norm_args(self.q_a_norm)
        kn = norm_args(self.kv_a_norm)
        return FusedMLA(
            tuple(packed(lin.weight) for lin in lins), (PACKED[tk](*ak), PACKED[tv](*av)),
            tuple(int(lin.weight.N) for lin in lins),
            tuple(int(lin.weight.nbytes) for lin in lins) + (int(wk[0].nbytes), int(wv[0].nbytes)),
            (np.ascontiguousarray(qn[0]), np.ascontiguousarray(kn[0])),
            (1 if gkv == g1 else 0, q0, kv0, int(self.num_heads), int(self.head_dim), self.q_lora,
             int(self.value_dim)),
            (float(qn[1]), float(kn[1]), float(self.scale)))

    def to_device(self, conv, lp, kv_cache):
        from gpu_kernels.mla import DeviceMLA
        for name in self.head_names.values():
            if conv.tensor_device(lp, name) == "cpu":
                raise ValueError(f"{name}: an MLA layer on the GPU needs its attn_k_b/attn_v_b there too "
                                 "(an --override-tensor keeps it in RAM)")
        leaves = {k: conv.leaf(getattr(self, k), name, lp) for k, name in self.names.items()}
        heads = conv.stacked_experts(list(self.head_names.values()), [self.k_b_weights, self.v_b_weights], lp)
        return DeviceMLA(self, leaves, [h[0] for h in heads], [h[1] for h in heads], conv.norm(self.q_a_norm),
                         conv.norm(self.kv_a_norm), conv.ctx, kv_cache=kv_cache, kv_on_host=lp.kv_device == "cpu")

    @property
    def k_b_weights(self) -> list:
        return self.heads[0][2]

    @property
    def v_b_weights(self) -> list:
        return self.heads[1][2]


def _head_weights(ws, prefix: str, names: dict, num_heads: int, nope: int, value_dim: int, kv_lora: int):
    """((ggml type, packed arrays with a leading head axis, one QuantLinear per head) of attn_k_b, of attn_v_b).
    Legacy files hold the unsplit attn_kv_b instead: it is dequantized and split as llama.cpp's converter does."""
    want = {"k_b": (num_heads, kv_lora, nope), "v_b": (num_heads, value_dim, kv_lora)}
    if all(has(ws, n) for n in names.values()):
        out = []
        for k, name in names.items():
            info = ws.info(name)
            if tuple(info.shape) != want[k]:
                raise ModelLoadError(f"{ws.path}: tensor '{name}': shape {tuple(info.shape)}, expected {want[k]}")
            arrays, weights = stacked_experts(info.ggml_type, ws.raw(name), info.shape)
            if weights[0].fmt.repack_copies:
                ws.release(name)
            out.append((info.ggml_type, arrays, weights))
        return tuple(out)
    legacy = prefix + "attn_kv_b.weight"
    if not has(ws, legacy):
        ws.required(list(names.values()))  # names the missing tensors
    info = ws.info(legacy)
    if tuple(info.shape) != (num_heads * (nope + value_dim), kv_lora):
        raise ModelLoadError(f"{ws.path}: tensor '{legacy}': shape {tuple(info.shape)} does not split into "
                             f"{num_heads} heads of {nope} + {value_dim} rows of {kv_lora}")
    w = QuantLinear.from_raw(info.ggml_type, ws.raw(legacy), tuple(info.shape)).dequantize()
    out = []
    for part in split_kv_b(w, num_heads, nope, value_dim):
        arrays, weights = stacked_experts(GT.F32, part, part.shape)
        out.append((GT.F32, arrays, weights))
    return tuple(out)
