"""The size model behind the planner: what each placement of each tensor costs on each device.

Bytes on a GPU: packed GGUF blocks as stored, or numel x the dtype dequantized to; norms, biases and MoE
routers in float32. KV: 2 (K and V; 1 where V is K, MLA's latent) x block_size x kv heads x head_dim x the KV dtype
per block in each layer (ModelMeta.layer_cache, from the architecture's kv_layout), in as many blocks as the pool has on full
attention layers and at most what max_num_seqs requests' windows need on sliding ones (kv_bytes). Work:
activations of max_num_batched_tokens rows, attention scratch, dequantization tiles, staging for
streamed layers and the logits of the rows that sample. Margin: the runtime's own (CUDA context).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import math

from engine.core.kv_spec import KV_RAM_FRACTION, sliding_pool_blocks
from offload.devices import Devices, DeviceInfo
from offload.meta import ModelMeta, TensorMeta
from offload.plan_types import GIB, DeviceUsage, PlanOptions, gib

MIB = 1 << 20
# Types gpu_kernels/dequant.py can keep packed on a device (a test checks the two agree).
DEVICE_PACKED_TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                 "Q4_K", "Q5_K", "Q6_K", "MXFP4", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS",
                                 "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "NVFP4",
                                 "FP8_E4M3", "U8_ZP", "Q8_A16"})
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
ATTN_SCRATCH = 256 * MIB   # gpu_kernels.attention.SCRATCH_BYTES
# llama.cpp's --fit-ctx default: the least context `auto` keeps room for when --max-model-len was not chosen.
FIT_MIN_TOKENS = 4096
PACKED_TILE_WORK = 128 * MIB  # dequantization temporaries of one tile on the packed path


@dataclass
class _Choice:
    device: str           # "cpu" | "gpu"
    fmt: str              # "packed" | float32 | float16 | bfloat16 (for what runs on the GPU)
    streamed: bool = False
    exps_cpu: bool = False  # routed experts kept in RAM by `auto`


def ranges(ix: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out, ix = [], sorted(ix)
    i = 0
    while i < len(ix):
        j = i
        while j + 1 < len(ix) and ix[j + 1] == ix[j] + 1:
            j += 1
        out.append(str(ix[i]) if i == j else f"{ix[i]}-{ix[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def layers_text(ix: list[int]) -> str:
    """[3] -> "layer 3"; [0, 1, 2, 5] -> "layers 0-2, 5"."""
    return f"layer {ix[0]}" if len(ix) == 1 else f"layers {ranges(ix)}"


def is_router(t: TensorMeta) -> bool:
    return ".ffn_gate_inp." in t.name


def _unit(t: TensorMeta) -> str:
    """Tensors that move together: one matrix (+ its bias), a layer's MoE (router + experts), its norms."""
    leaf = t.name.split(".")[2] if t.layer is not None else t.name.rsplit(".", 1)[0]
    if t.is_expert or leaf == "ffn_gate_inp":
        return "moe"
    if not t.is_matrix and not t.name.endswith(".bias"):
        return "norm"
    return leaf




class SizeModel:
    """Sizes of a model's parts under a placement; the planner (a subclass) makes the choices."""

    def __init__(self, meta: ModelMeta, devices: Devices, o: PlanOptions):
        self.m, self.d, self.o = meta, devices, o
        self.L = meta.num_layers
        self.reasons: list[str] = []
        self.warnings: list[str] = []
        self.ram = devices.ram
        self.gpu: DeviceInfo | None = None
        self.units = [self._layer_units(i) for i in range(self.L)]
        # One block's bytes in each layer (0 where the layer holds none of its own); the largest is what plans report.
        self.layer_block_bytes = [meta.layer_cache(i).bytes_per_block(o.block_size, o.kv_cache_dtype)
                                  if meta.has_kv(i) else 0 for i in range(self.L)]
        self.block_layer_bytes = max(self.layer_block_bytes, default=0)
        # Hybrid models: only paged layers hold KV blocks; linear-attention layers hold state_slots states each
        # (the engine's count when it plans, else one live state per running request and the scratch slot).
        self.kv_flags = [meta.has_kv(i) for i in range(self.L)]
        self.state_slots = (o.num_state_slots or o.max_num_seqs + 1) if meta.has_states else 0
        self.ignore_rules = False
        self._layer_bytes: dict[tuple, tuple[int, int, int]] = {}
        # KV blocks (the null block included) that requests can use at once, and the least `auto` keeps room for.
        self.max_model_len = o.max_model_len or meta.max_position_embeddings
        self.need_blocks = o.max_num_seqs * math.ceil(self.max_model_len / o.block_size) + 1
        self.floor_tokens = self.max_model_len if o.max_model_len_set else min(self.max_model_len, FIT_MIN_TOKENS)
        self.floor_blocks = min(self.need_blocks, math.ceil(self.floor_tokens / o.block_size) + 1)
        if o.num_gpu_blocks_override:
            self.need_blocks = self.floor_blocks = int(o.num_gpu_blocks_override)
        # Per layer, the most blocks it holds (None: as many as the pool): a sliding layer's group frees the blocks
        # that leave its window (core/kv_cache.py), so it holds what max_num_seqs requests' windows need.
        self.layer_cap = [None if not w or o.num_gpu_blocks_override else
                          sliding_pool_blocks(w, o.block_size, o.max_num_seqs, o.max_num_batched_tokens,
                                              self.max_model_len)
                          for w in (getattr(meta.layer_cache(i), "window", 0) for i in range(self.L))]

    # ------------------------------------------------------------ KV
    def kv_bytes(self, blocks: int, layers) -> int:
        """KV bytes of a pool of `blocks` blocks in the given layers (a sliding layer's capped at what it uses)."""
        cap = self.layer_cap
        per = self.layer_block_bytes
        return sum(per[i] * (blocks if cap[i] is None else min(blocks, cap[i])) for i in layers)

    def blocks_within(self, budget: int, layers, most: int) -> int:
        """The largest pool (at most `most` blocks) whose KV in `layers` fits `budget` bytes."""
        lo, hi = 0, most
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.kv_bytes(mid, layers) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def ram_kv_budget(self) -> tuple[int, str]:
        """Bytes of RAM the KV may take, and what set them."""
        o, m = self.o, self.m
        if o.kv_pool_blocks is not None:
            return (o.kv_pool_blocks * sum(self.layer_block_bytes),
                    "the engine's KV pool (kv_cache_memory, else a share of the RAM left after the weights)")
        if o.kv_cache_memory is not None:
            return int(o.kv_cache_memory * GIB), f"kv_cache_memory {o.kv_cache_memory:g} GiB"
        return (int(max(self.ram.free_bytes - m.total_bytes, 1 << 28) * KV_RAM_FRACTION),
                f"{KV_RAM_FRACTION:.0%} of the RAM left after the weights")

    def host_kv_layers(self, choices: list[_Choice]) -> list[int]:
        """Layers whose KV sits in host RAM: CPU layers, GPU layers with --kv-offload, all of them when the
        GPU's memory is the host's (torch's CPU device, APUs)."""
        shared = self.gpu is not None and self.gpu.shared_with_host
        return [i for i, (f, c) in enumerate(zip(self.kv_flags, choices))
                if f and (c.device == "cpu" or self.o.kv_offload or shared)]

    def gpu_kv_layers(self, choices: list[_Choice]) -> list[int]:
        """Layers whose KV blocks live on the GPU."""
        return [] if self.o.kv_offload else [i for i, (f, c) in enumerate(zip(self.kv_flags, choices))
                                             if f and c.device == "gpu"]

    def state_bytes(self, choices: list[_Choice], on_gpu: bool) -> int:
        """The state pools of the linear-attention layers whose states live on the GPU (on_gpu) or in RAM."""
        return self.state_slots * sum(self.m.state_bytes_of(i) for i, c in enumerate(choices)
                                      if (c.device == "gpu" and not self.o.kv_offload) == on_gpu)

    def kv_wanted(self, choices: list[_Choice]) -> tuple[int, str]:
        """KV blocks these choices want: what requests can use (max_model_len x max_num_seqs), within the RAM
        budget for the layers whose KV lives in RAM; a discrete GPU's KV is bounded by its room (fit_kv).
        Returns (blocks, why)."""
        o = self.o
        if o.num_gpu_blocks_override:
            return self.need_blocks, "num_gpu_blocks_override"
        host = self.host_kv_layers(choices)
        budget, what = self.ram_kv_budget()
        if host and self.kv_bytes(self.need_blocks, host) > budget:
            fit = self.blocks_within(budget, host, self.need_blocks)
            return fit, f"{what}: {gib(budget)} for {len(host)} layer(s)"
        return self.need_blocks, f"max_model_len {self.max_model_len} x max_num_seqs {o.max_num_seqs}"

    # ------------------------------------------------------------ sizes
    def _layer_units(self, i: int) -> dict[str, list[TensorMeta]]:
        units: dict[str, list[TensorMeta]] = {}
        for t in self.m.layer_tensors(i):
            units.setdefault(_unit(t), []).append(t)
        return units

    def rule(self, names: list[str]) -> str | None:
        if self.ignore_rules:
            return None
        for pat, dev in self.o.override_tensor:
            if any(re.search(pat, n) for n in names):
                return "cpu" if dev == "cpu" else "gpu"
        return None

    def unit_device(self, unit: str, tensors: list[TensorMeta], c: _Choice) -> str:
        if unit == "norm":
            return c.device
        r = self.rule([t.name for t in tensors])
        if r == "gpu" and self.gpu is None:
            r = None
        if r:
            return r
        if unit == "moe" and c.exps_cpu:
            return "cpu"
        return c.device

    def override_text(self, choices: list[_Choice]) -> str:
        """"; --override-tensor keeps the routed experts (with their router) of layers 0-47 (16.35 GiB) in RAM",
        or "" when no rule moves a tensor of a layer off that layer's device."""
        groups: dict[tuple[str, str], list[int]] = {}
        nbytes: dict[tuple[str, str], int] = {}
        for i, c in enumerate(choices):
            for unit, ts in self.units[i].items():
                r = self.rule([t.name for t in ts]) if unit != "norm" else None
                if r is None or r == c.device or (r == "gpu" and self.gpu is None):
                    continue
                key = ("routed experts (with their router)" if unit == "moe" else unit, r)
                groups.setdefault(key, []).append(i)
                nbytes[key] = nbytes.get(key, 0) + sum(t.nbytes for t in ts)
        parts = [f"{what} of {layers_text(ix)} ({gib(nbytes[(what, d)])}) "
                 f"{'in RAM' if d == 'cpu' else 'on ' + self.gpu.name}" for (what, d), ix in groups.items()]
        return "; --override-tensor keeps the " + ", the ".join(parts) if parts else ""

    def dev_bytes(self, t: TensorMeta, fmt: str) -> int:
        if not t.is_matrix or is_router(t):
            return t.numel * 4  # norms, biases and MoE routers go to the device in float32 (offload/convert.py)
        if fmt == "packed" and t.ggml_type in DEVICE_PACKED_TYPES:
            return t.nbytes
        return t.numel * DTYPE_BYTES.get(fmt, DTYPE_BYTES[self.compute_dtype])

    def layer_bytes(self, i: int, c: _Choice) -> tuple[int, int, int]:
        """(RAM, GPU, streamed) bytes of layer i's weights under choice c."""
        key = (i, c.device, c.fmt, c.streamed, c.exps_cpu, self.ignore_rules)
        if key not in self._layer_bytes:  # `auto` asks for the same layers many times over
            self._layer_bytes[key] = self._count_layer_bytes(i, c)
        return self._layer_bytes[key]

    def _count_layer_bytes(self, i: int, c: _Choice) -> tuple[int, int, int]:
        ram = gpu = streamed = 0
        for unit, ts in self.units[i].items():
            if self.unit_device(unit, ts, c) == "cpu":
                ram += sum(t.nbytes for t in ts)
            else:
                for t in ts:
                    b = self.dev_bytes(t, c.fmt)
                    if c.streamed and not is_router(t):  # the router is copied once, not streamed
                        streamed += b
                    else:
                        gpu += b
        return ram, gpu, streamed

    def output_tensors(self) -> tuple[TensorMeta, TensorMeta | None]:
        head = self.m.tensor("output.weight") if not self.m.tie_word_embeddings else None
        return head or self.m.tensor("token_embd.weight"), self.m.tensor("output_norm.weight")

    def output_bytes(self, on_gpu: bool, fmt: str) -> tuple[int, int]:
        head, norm = self.output_tensors()
        nb = norm.numel * 4 if norm else 0
        if on_gpu:
            return 0, self.dev_bytes(head, fmt) + nb
        return (0 if self.m.tie_word_embeddings else head.nbytes) + nb, 0

    def work_bytes(self, choices: list[_Choice], out_gpu: bool) -> int:
        on = [c for c in choices if c.device == "gpu"]
        if not on and not out_gpu:
            return 0
        m, T = self.m, self.o.max_num_batched_tokens
        ffn = max(m.intermediate_size if not m.num_experts else 0, m.moe_intermediate_size * m.num_experts_per_tok)
        act = T * (4 * m.hidden_size + (m.num_heads + 2 * m.num_kv_heads) * m.head_dim + 3 * ffn) * 4
        work = act + ATTN_SCRATCH
        if any(c.fmt == "packed" for c in on) or out_gpu:
            work += PACKED_TILE_WORK
        staged = [self.layer_bytes(i, c)[2] for i, c in enumerate(choices) if c.streamed]
        if staged:
            work += 2 * max(staged)
        if out_gpu:
            work += min(T, max(128, self.o.max_num_seqs)) * m.vocab_size * 4 * 2
        return work

    def margin(self) -> int:
        g = self.gpu
        return 0 if g is None or g.kind == "torch-cpu" else 256 * MIB + g.total_bytes // 100

    def gpu_need(self, choices, out_gpu: bool, out_fmt: str, blocks: int) -> DeviceUsage:
        w = sum(self.layer_bytes(i, c)[1] for i, c in enumerate(choices)) + self.output_bytes(out_gpu, out_fmt)[1]
        kv = self.kv_bytes(blocks, self.gpu_kv_layers(choices)) + self.state_bytes(choices, True)
        return DeviceUsage(self.gpu.name, self.budget, w, kv,
                           self.work_bytes(choices, out_gpu), self.margin())

    def fits(self, choices, out_gpu, out_fmt, blocks) -> bool:
        return self.gpu_need(choices, out_gpu, out_fmt, blocks).total <= self.budget

