"""plan(model_meta, devices, args) -> PlacementPlan: which layer computes where, where its KV lives, and
how many bytes each device then holds. Pure arithmetic on ModelMeta and Devices: no torch, no weights.

Rules (llama.cpp's and vLLM's, where they have one):
- --n-gpu-layers N puts the last N layers on the GPU (the hidden state crosses once, and the output
  matrix can follow); N > num_layers or `all` moves the output matrix too. The embedding stays in RAM
  (a lookup reads one row per token).
- `auto` places layers first (llama.cpp's --fit order: the context shrinks before layers leave the GPU),
  keeping room for the KV of one request of --max-model-len (when it was not given: at most 4096
  tokens, llama.cpp's --fit minimum). It fits: everything; else for MoE models all layers with the
  routed experts in RAM (then experts back onto the GPU from the last layer while they fit); else as
  many last layers as fit. The KV then takes what is left, up to max_model_len x max_num_seqs tokens,
  so more RAM never means fewer GPU layers. With --gpu-weight-dtype auto, weights are placed packed
  (GGUF blocks) first, then layers are dequantized once to the compute dtype, output matrix first, while
  the whole wanted KV still fits.
- KV blocks: what requests can use (max_model_len x max_num_seqs); the KV kept in RAM (CPU layers,
  --kv-offload, GPUs sharing the host's memory) within kv_cache_memory or a share of the free RAM, the
  KV on a discrete GPU within the room its layers leave.
- --cpu-offload-gb X (vLLM's): the first GPU layers, up to X GiB of weights, stay in RAM and are copied
  to the GPU at every step; in `auto` they let more layers compute on the GPU.
- budget = gpu_memory_utilization x total - memory used by others (vLLM's reading); on a GPU that
  shares memory with the host, at most that fraction of the RAM available.
"""
from __future__ import annotations

import re
from dataclasses import replace

from offload.devices import Devices
from offload.meta import ModelMeta
from offload.plan_types import GIB, DeviceUsage, KVPlan, LayerPlan, PlacementPlan, PlanOptions, gib
from engine.core.kv_spec import kv_storage_dtype
from offload.sizes import DTYPE_BYTES, FIT_MIN_TOKENS, SizeModel, _Choice, layers_text


def plan(model_meta: ModelMeta, devices: Devices, args=None, **overrides) -> PlacementPlan:
    """Args:
        model_meta: offload.meta.model_meta(ws) or synthetic_meta(shape).
        devices: offload.devices.probe_devices() or load_devices(file).
        args: EngineArgs, PlanOptions or None; keyword overrides win (e.g. kv_pool_blocks=...).
    Raises ValueError when an explicit request cannot fit (the message says what would)."""
    o = args if isinstance(args, PlanOptions) and not overrides else PlanOptions.from_args(args, **overrides)
    return _Planner(model_meta, devices, o).run()


class _Planner(SizeModel):
    """The choices: which GPU and budget, which layers, formats, streaming, KV size; then the plan."""

    def pick_gpu(self) -> None:
        o, d = self.o, self.d
        self.gpu = d.gpu(o.gpu_device) if o.gpu_device else (d.gpus[0] if d.gpus else None)
        if o.gpu_device and self.gpu is None:
            names = ", ".join(g.name for g in d.gpus) or "none"
            raise ValueError(f"gpu_device {o.gpu_device!r} not found (GPUs: {names}; 'cpu' runs the GPU path "
                             "on torch's CPU device)")
        for _, dev in o.override_tensor:
            if dev not in ("cpu", "gpu") and self.gpu is not None and dev != self.gpu.name:
                raise ValueError(f"--override-tensor names {dev} but this plan uses {self.gpu.name} "
                                 "(one GPU per plan; set --gpu-device)")
        g = self.gpu
        if g is None:
            self.budget = 0
            self.compute_dtype = "float32"
            return
        if g.name in d.absent and o.wants_gpu():
            raise ValueError(f"{g.name} is described in {d.source}, but torch does not see it on this machine: a "
                             "devices file can resize this machine's devices, not add one (--gpu-device cpu runs "
                             "the GPU path on torch's CPU device; `ramlm plan --devices-file` plans for another "
                             "machine)")
        util = o.gpu_memory_utilization
        if g.kind == "torch-cpu":
            self.budget = int(g.free_bytes * util)
            how = f"{util:.2f} x {gib(g.free_bytes)} of RAM available"
        else:
            used = g.total_bytes - g.free_bytes
            self.budget = max(0, int(g.total_bytes * util) - used)
            how = f"{util:.2f} x {gib(g.total_bytes)} - {gib(used)} in use"
            if g.shared_with_host:
                self.budget = min(self.budget, int(self.ram.free_bytes * util))
                how += f", at most {util:.2f} x {gib(self.ram.free_bytes)} of RAM available (shared memory)"
        if g.kind == "torch-cpu":
            self.compute_dtype = "float32"
        else:
            self.compute_dtype = "bfloat16" if g.supports_bf16() else "float16"
        if o.gpu_weight_dtype in DTYPE_BYTES:
            self.compute_dtype = o.gpu_weight_dtype
        if o.dtype in ("float32", "bfloat16"):  # vLLM's dtype is the compute type of every layer
            if o.gpu_weight_dtype in DTYPE_BYTES and o.gpu_weight_dtype != o.dtype:
                raise ValueError(f"dtype={o.dtype!r} conflicts with gpu_weight_dtype={o.gpu_weight_dtype!r}")
            if o.dtype == "bfloat16" and not g.supports_bf16():
                raise ValueError(f"dtype='bfloat16': {g.name} has no bfloat16 support")
            self.compute_dtype = o.dtype
        desc = f" ({g.description})" if g.description else ""
        mem = "shares memory with the host" if g.shared_with_host else "discrete memory"
        self.reasons.append(f"GPU {g.name}{desc}: {gib(g.total_bytes)}, {gib(g.free_bytes)} free, {mem}; "
                            f"budget {gib(self.budget)} = {how}; computes in {self.compute_dtype}")

    def run(self) -> PlacementPlan:
        o = self.o
        self.pick_gpu()
        self.reasons.insert(0, f"model {self.m.name} ({self.m.arch}, {self.L} layers"
                               f"{', MoE' if self.m.is_moe else ''}): {gib(self.m.total_bytes)} of weights as stored")
        cpu_only = [_Choice("cpu", "packed") for _ in range(self.L)]
        if not o.wants_gpu():
            self.reasons.append("n_gpu_layers 0: every layer runs on the CPU (Numba kernels, weights in RAM)")
            return self.finish(cpu_only, False, "native", *self.kv_wanted(cpu_only))
        if self.gpu is None:
            msg = "no GPU found: every layer runs on the CPU"
            (self.reasons if o.n_gpu_layers == "auto" else self.warnings).append(msg)
            return self.finish(cpu_only, False, "native", *self.kv_wanted(cpu_only))
        fmt0 = "packed" if o.gpu_weight_dtype == "auto" else o.gpu_weight_dtype
        if o.n_gpu_layers == "auto":
            choices, out_gpu = self.auto(fmt0)
        else:
            choices, out_gpu = self.explicit(fmt0)
        wanted, why = self.kv_wanted(choices)
        out_fmt = fmt0 if out_gpu else "native"
        if o.gpu_weight_dtype == "auto" and (out_gpu or any(c.device == "gpu" for c in choices)):
            fmt = self.upgrade(choices, out_gpu, wanted)
            out_fmt = fmt if out_gpu else out_fmt
        self.stream_reason(choices)
        blocks, why = self.fit_kv(choices, out_gpu, out_fmt, wanted, why)
        if o.n_gpu_layers == "auto" and blocks < wanted:
            self.trade_reason(fmt0, blocks, wanted)
        self.check_pointless(choices, out_gpu, fmt0, blocks)
        return self.finish(choices, out_gpu, out_fmt, blocks, why)

    def layers_on(self, n: int, fmt: str, exps_cpu: bool) -> list[_Choice]:
        return [_Choice("gpu" if i >= self.L - n else "cpu", fmt, False, exps_cpu and i >= self.L - n)
                for i in range(self.L)]

    def auto(self, fmt0: str) -> tuple[list[_Choice], bool]:
        """Layers first, with room for the KV floor (llama.cpp's --fit order: the context shrinks before layers
        leave the GPU); fit_kv then gives the KV what is left, up to what requests can use."""
        g, bs = self.gpu.name, self.o.block_size
        o = self.o
        if o.kv_offload:
            self.reasons.append("auto: --kv-offload keeps the KV in RAM: the GPU budget goes to weights")
        elif o.num_gpu_blocks_override:
            self.reasons.append(f"auto: keeps room on {g} for num_gpu_blocks_override {self.floor_blocks} blocks, "
                                "then places layers")
        else:
            floor = ("one request of --max-model-len" if o.max_model_len_set else
                     f"--max-model-len unset: at most {FIT_MIN_TOKENS}, llama.cpp's --fit minimum")
            self.reasons.append(f"auto: places layers first, keeping room on {g} for the KV of "
                                f"{(self.floor_blocks - 1) * bs} tokens ({floor}); the KV then takes what is left, "
                                f"up to max_model_len {self.max_model_len} x max_num_seqs {o.max_num_seqs} = "
                                f"{self.max_model_len * o.max_num_seqs} tokens")
        choices, out_gpu, text = self.choose(fmt0, self.floor_blocks)
        self.reasons.append("auto: " + text)
        return choices, out_gpu

    def choose(self, fmt0: str, blocks: int) -> tuple[list[_Choice], bool, str]:
        """The most of the model that fits beside `blocks` KV blocks: everything; else (MoE) all layers with
        routed experts in RAM, then experts back from the last layer while they fit; else the last layers.
        Returns (choices, output on GPU, what was chosen)."""
        L, g = self.L, self.gpu.name
        every = self.layers_on(L, fmt0, False)
        if self.fits(every, True, fmt0, blocks):
            return every, True, f"all {L} layers and the output matrix fit on {g}" + self.override_text(every)
        if self.m.is_moe:
            c = self.layers_on(L, fmt0, True)
            if self.fits(c, True, fmt0, blocks):
                back = []
                for i in reversed(range(L)):
                    c[i].exps_cpu = False
                    if not self.fits(c, True, fmt0, blocks):
                        c[i].exps_cpu = True
                        break
                    back.append(i)
                kept = [i for i in range(L) if c[i].exps_cpu]
                return c, True, (f"attention and norms of all {L} layers and the output matrix on {g}; routed "
                                 f"experts (with their router) of {layers_text(kept)} in RAM (a token reads "
                                 f"{self.m.num_experts_per_tok} of {self.m.num_experts} experts, so RAM bandwidth "
                                 "serves them best)" + (f"; experts of {layers_text(back)} fit on {g}" if back else "")
                                 + self.override_text(c))
        for n in range(L, -1, -1):
            c = self.layers_on(n, fmt0, self.m.is_moe)
            self.mark_streamed(c)  # --cpu-offload-gb: the lowest GPU layers need no room for weights
            if self.fits(c, False, fmt0, blocks):
                break
        if n == 0:
            one = self.gpu_need(self.layers_on(1, fmt0, self.m.is_moe), False, fmt0, blocks)
            return c, False, (f"not even one layer fits on {g} (one needs {gib(one.total)} with its KV and work "
                              f"buffers; budget {gib(self.budget)}): every layer runs on the CPU")
        return c, False, (f"the last {n} of {L} layers fit on {g}" + (" (routed experts in RAM)" if self.m.is_moe
                                                                    else "")
                          + "; the output matrix stays in RAM (it follows only when every layer fits)"
                          + self.override_text(c))

    def trade_reason(self, fmt0: str, blocks: int, wanted: int) -> None:
        """What `auto` traded: the KV it gave up to keep layers on the GPU."""
        bs, g = self.o.block_size, self.gpu.name
        alt, alt_out, _ = self.choose(fmt0, wanted)
        n = sum(c.device == "gpu" for c in alt)
        exps = sum(self.unit_device("moe", ts["moe"], c) == "gpu" for c, ts in zip(alt, self.units) if "moe" in ts)
        kept = (f"{n} of {self.L} layers" + (f" ({exps} with their experts)" if n and exps < n and self.m.is_moe
                                             and any(c.exps_cpu for c in alt) else "")
                + (" and the output matrix" if alt_out else ""))
        self.reasons.append(f"auto: traded KV for layers: the KV holds {(blocks - 1) * bs} of the "
                            f"{(wanted - 1) * bs} tokens wanted; room for all of them would have left {kept} on {g}")

    def explicit(self, fmt0: str) -> tuple[list[_Choice], bool]:
        L, s = self.L, self.o.n_gpu_layers
        n = L + 1 if s == "all" else int(s)  # PlanOptions checked the spelling
        choices, out_gpu = self.layers_on(min(n, L), fmt0, False), n > L
        where = layers_text([i for i in range(L) if choices[i].device == "gpu"]) if n else "no layer"
        last = " (the last ones, as llama.cpp)" if 0 < n < L else ""
        self.reasons.append(f"n_gpu_layers {s}: {where} on {self.gpu.name}{last}, "
                            f"output matrix {'on ' + self.gpu.name if out_gpu else 'in RAM (needs > ' + str(L) + ')'}"
                            + self.override_text(choices))
        self.mark_streamed(choices)
        return choices, out_gpu

    def upgrade(self, choices: list[_Choice], out_gpu: bool, blocks: int) -> str:
        """--gpu-weight-dtype auto: dequantize once to the compute dtype (output first, then the last layers)
        while the budget still holds the KV; the rest stays packed. Returns the output's format."""
        dense, out_fmt = self.compute_dtype, "packed"
        if out_gpu and self.fits(choices, True, dense, blocks):
            out_fmt = dense
        up = []
        for i in reversed(range(self.L)):
            c = choices[i]
            if c.device != "gpu" or c.streamed:
                continue
            c.fmt = dense
            if self.fits(choices, out_gpu, out_fmt, blocks):
                up.append(i)
            else:
                c.fmt = "packed"
        packed = [i for i, c in enumerate(choices) if c.device == "gpu" and c.fmt == "packed"]
        msg = f"weights on {self.gpu.name}: "
        msg += f"{layers_text(up)} dequantized once to {dense}" if up else "no layer fits dequantized"
        if packed:
            msg += f"; {layers_text(packed)} stay packed (GGUF blocks, dequantized per matmul)"
        if out_gpu:
            msg += f"; output matrix {'dequantized' if out_fmt == dense else 'packed'}"
        self.reasons.append(msg + " (--gpu-weight-dtype to force one)")
        return out_fmt

    def mark_streamed(self, choices: list[_Choice]) -> list[int]:
        """--cpu-offload-gb X (vLLM's reading: the GPU grows by X): the first GPU layers, up to X GiB of
        their weights, stay in RAM and are copied in at every step."""
        x, total, done = int(self.o.cpu_offload_gb * GIB), 0, []
        for i, c in enumerate(choices):
            if x <= 0 or c.device != "gpu":
                continue
            fmt = "packed" if self.o.gpu_weight_dtype == "auto" else c.fmt  # packed: less to copy each step
            b = self.layer_bytes(i, replace(c, streamed=True, fmt=fmt))[2]
            if total + b > x:
                break
            c.streamed, c.fmt = True, fmt
            done.append(i)
            total += b
        return done

    def stream_reason(self, choices) -> None:
        if self.o.cpu_offload_gb <= 0:
            return
        done = [i for i, c in enumerate(choices) if c.streamed]
        total = sum(self.layer_bytes(i, choices[i])[2] for i in done)
        self.reasons.append(f"cpu_offload_gb {self.o.cpu_offload_gb:g}: {layers_text(done)} ({gib(total)}) compute "
                            f"on {self.gpu.name} with weights kept in RAM, copied in at every step")

    def fit_kv(self, choices, out_gpu, out_fmt, blocks, why) -> tuple[int, str]:
        need = self.gpu_need(choices, out_gpu, out_fmt, 0)
        g = self.gpu.name
        if need.total > self.budget:
            raise ValueError(f"n_gpu_layers {self.o.n_gpu_layers}: weights and work buffers need {gib(need.total)} "
                             f"on {g}, over its budget of {gib(self.budget)}; try --n-gpu-layers auto, "
                             "--gpu-weight-dtype packed, --cpu-offload-gb or --override-tensor exps=CPU")
        kv_layers = self.gpu_kv_layers(choices)  # (need counted the GPU's state pools already)
        if not kv_layers:
            return blocks, why
        if self.kv_bytes(blocks, kv_layers) <= self.budget - need.total:
            return blocks, why
        fit = self.blocks_within(self.budget - need.total, kv_layers, blocks)
        if self.o.num_gpu_blocks_override:
            raise ValueError(f"num_gpu_blocks_override {blocks}: {g} holds only {fit} blocks for its {len(kv_layers)} "
                             "layers after the weights")
        if fit < 2:
            raise ValueError(f"n_gpu_layers {self.o.n_gpu_layers}: no room left on {g} for KV blocks "
                             f"({gib(self.budget - need.total)} after weights); use fewer layers or --kv-offload")
        if (fit - 1) * self.o.block_size < self.max_model_len:
            fix = ("--max-model-len N keeps room for one request of N tokens" if self.o.n_gpu_layers == "auto"
                   else "lower --n-gpu-layers, or use --kv-offload")
            self.warnings.append(f"the KV on {g} holds {(fit - 1) * self.o.block_size} tokens, less than "
                                 f"max_model_len {self.max_model_len}: a request that long cannot run; {fix}")
        return int(fit), f"room left on {g} after the weights"

    def check_pointless(self, choices, out_gpu, fmt0, blocks) -> None:
        o, g = self.o, self.gpu
        in_ram = [i for i, c in enumerate(choices) if c.device == "cpu" or c.streamed or c.exps_cpu]
        moved = [i for i, c in enumerate(choices)
                 if any(self.unit_device(u, ts, c) == "cpu" for u, ts in self.units[i].items())]
        offloading = bool(in_ram or moved or not out_gpu or o.kv_offload)
        if not offloading or g.kind == "torch-cpu":  # torch's CPU device is for testing, not for speed
            return
        self.ignore_rules = True
        try:
            everything = self.gpu_need(self.layers_on(self.L, fmt0, False), True, fmt0, blocks)
        finally:
            self.ignore_rules = False
        if o.kv_offload:
            kv_layers = [i for i in range(self.L) if self.kv_flags[i]]
            everything = replace(everything, kv=self.kv_bytes(blocks, kv_layers)
                                 + self.state_slots * sum(self.m.state_bytes_of(i) for i in range(self.L)))
        if everything.total <= self.budget:
            self.warnings.append(
                f"offload is pointless here: the whole model and its KV ({gib(everything.total)}) fit in "
                f"{g.name}'s budget ({gib(self.budget)}), yet this plan keeps "
                + ", ".join(filter(None, [f"{layers_text(in_ram)}" if in_ram else "",
                                          f"tensors of {layers_text(moved)}" if moved and not in_ram else "",
                                          "the output matrix" if not out_gpu else "",
                                          "the KV (--kv-offload)" if o.kv_offload else ""]))
                + " in RAM; --n-gpu-layers all would be faster")
        if g.shared_with_host and g.kind != "torch-cpu":
            self.warnings.append(f"{g.name} shares its memory with the host: what stays in RAM frees no GPU memory "
                                 "and runs on the slower CPU path")

    # ------------------------------------------------------------ the plan
    def finish(self, choices, out_gpu: bool, out_fmt: str, blocks: int, why: str) -> PlacementPlan:
        o, m, g = self.o, self.m, self.gpu
        gname = g.name if g is not None else None
        layers, ram_w, gpu_w = [], 0, 0
        for i, c in enumerate(choices):
            ram, gpu, streamed = self.layer_bytes(i, c)
            dev = gname if c.device == "gpu" else "cpu"
            elsewhere = {}
            for unit, ts in self.units[i].items():
                ud = self.unit_device(unit, ts, c)
                if ud != c.device:
                    elsewhere.update({t.name: gname if ud == "gpu" else "cpu" for t in ts})
            nbytes = {k: v for k, v in (("cpu", ram + streamed), (gname, gpu)) if v}
            layers.append(LayerPlan(i, dev, "streamed" if c.streamed else ("device" if dev != "cpu" else "ram"),
                                    c.fmt if dev != "cpu" else "native",
                                    dev if dev != "cpu" and not o.kv_offload else "cpu", elsewhere, nbytes))
            ram_w += ram + streamed
            gpu_w += gpu
        embed = m.tensor("token_embd.weight")
        out_ram, out_dev = self.output_bytes(out_gpu, out_fmt if out_fmt != "native" else "packed")
        ram_w += embed.nbytes + out_ram
        gpu_w += out_dev
        kv_by = {}
        for lp in layers:
            if self.kv_flags[lp.index]:  # (linear-attention layers hold states, not blocks)
                kv_by[lp.kv_device] = kv_by.get(lp.kv_device, 0) + 1
        gpu_kv_layers = sum(n for d, n in kv_by.items() if d != "cpu")
        tier = int(o.num_cpu_blocks or 0)
        if tier and not gpu_kv_layers:
            self.warnings.append("num_cpu_blocks is set but no KV lives on a GPU: there is nothing to tier")
            tier = 0
        if o.kv_offload and not [lp for lp in layers if lp.device != "cpu"]:
            self.warnings.append("kv_offload does nothing: no layer runs on a GPU")
        per = self.block_layer_bytes
        usage = []
        T = o.max_num_batched_tokens
        cpu_work = T * (4 * m.hidden_size + 3 * max(m.intermediate_size, m.moe_intermediate_size)) * 4
        ram_kv = self.kv_bytes(blocks, [lp.index for lp in layers if lp.kv_device == "cpu" and self.kv_flags[lp.index]])
        ram_use = DeviceUsage("cpu", self.ram.free_bytes, ram_w,
                              # the tier holds a swapped block's KV in every layer (one block id space)
                              ram_kv + tier * sum(self.layer_block_bytes) + self.state_bytes(choices, False), cpu_work)
        usage.append(ram_use)
        if g is not None and (gpu_w or gpu_kv_layers or out_gpu):
            dev_kv = self.kv_bytes(blocks, [lp.index for lp in layers
                                            if lp.kv_device != "cpu" and self.kv_flags[lp.index]])
            dev_use = DeviceUsage(gname, self.budget, gpu_w, dev_kv + self.state_bytes(choices, True),
                                  self.work_bytes(choices, out_gpu), self.margin())
            usage.append(dev_use)
            if g.shared_with_host and ram_use.total + dev_use.total > self.ram.free_bytes:
                self.warnings.append(f"RAM and {gname} share {gib(self.ram.free_bytes)} available, and this plan "
                                     f"needs {gib(ram_use.total + dev_use.total)} of it")
        if ram_use.total > self.ram.free_bytes:
            self.warnings.append(f"the RAM side needs {gib(ram_use.total)}, more than the {gib(self.ram.free_bytes)} "
                                 "available (GGUF pages are mapped and can be paged out, repacked weights cannot)")
        caps = sorted({c for c in self.layer_cap if c is not None and c < blocks})
        self.reasons.append(f"KV: {blocks} blocks of {o.block_size} tokens per layer (limited by {why}"
                            + (f"; sliding-window layers hold at most {caps[-1]}, what {o.max_num_seqs} "
                               "requests' windows need" if caps else "") + "); "
                            + ", ".join(f"{n} layer(s) in {'RAM' if d == 'cpu' else d}" for d, n in kv_by.items())
                            + (" (--kv-offload: attention of GPU layers runs on the CPU over it)" if o.kv_offload
                               and gpu_kv_layers == 0 and len(kv_by) else "")
                            + (f"; a RAM tier of {tier} blocks ({gib(tier * sum(self.layer_block_bytes))}) behind the GPU"
                               " blocks" if tier else ""))
        if self.state_slots:
            linear = [i for i in range(self.L) if self.m.state_bytes_of(i)]
            self.reasons.append(f"states: {self.state_slots} slots (live states of running requests and prefix-cache "
                                f"checkpoints) of {gib(sum(self.m.state_bytes_of(i) for i in linear))} over the "
                                f"{len(linear)} linear-attention layers, with their layers: "
                                f"{gib(self.state_bytes(choices, False))} in RAM"
                                + (f", {gib(self.state_bytes(choices, True))} on {gname}" if gname else ""))
        self.reasons.append("embedding in RAM: a lookup reads one row per token, nothing to gain on a GPU")
        if g is not None and self.o.wants_gpu():
            self.reasons.append(f"output matrix {'on ' + gname if out_gpu else 'in RAM'}"
                                + (" (tied to the embedding: the GPU holds its own copy)"
                                   if out_gpu and m.tie_word_embeddings else ""))
        for pat, dev in o.override_tensor:
            hit = [t for t in m.tensors if re.search(pat, t.name)]
            self.reasons.append(f"override {pat}={dev}: matches {len(hit)} tensors ({gib(sum(t.nbytes for t in hit))})"
                                + ("; norms follow their layer, a MoE's router and experts move together"
                                   if hit else ""))
        opts = {k: (list(map(list, v)) if k == "override_tensor" else v) for k, v in o.__dict__.items()}
        return PlacementPlan(m.name, m.arch, self.L, gname if self.o.wants_gpu() else None,
                             g.kind if g is not None and self.o.wants_gpu() else "", bool(g and g.shared_with_host),
                             self.compute_dtype if g is not None else "float32", "cpu",
                             gname if out_gpu else "cpu", out_fmt if out_gpu else "native", tuple(layers),
                             KVPlan(o.block_size, kv_storage_dtype(o.kv_cache_dtype),
                                    int(blocks), int(blocks) * o.block_size, per, kv_by, tier, why),
                             tuple(usage), tuple(self.reasons), tuple(self.warnings), opts)
