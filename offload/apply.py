"""Applying a PlacementPlan to a loaded model: a transform after loading (gpt-fast style).

model.blocks[i] of a GPU layer is replaced by a gpu_kernels block with the same call signature
(x, meta, kv) -> x, its weights dequantized once or kept packed on the device, and its KV blocks on the
device (or, with --kv-offload, left in the runner's numpy cache). The model code never branches on a
device: DecoderModel.forward calls whatever block sits at position i.

Memory: the replaced CPU block is dropped, so its repacked weights are freed (unless keep_originals,
for benchmarks that undo). On torch's CPU device, packed weights are torch.from_numpy views of the GGUF
memory map: mapped, not copied. torch has no public way to wrap host pages as a CUDA/ROCm tensor, so on
integrated GPUs (shared memory) weights are copied once into device allocations of the same physical
RAM and the host copy is dropped; the planner counts RAM and such a GPU as one pool. On GH200/GB200 the
GPU could read host RAM coherently; that is what --cpu-offload-gb's streamed layers approximate.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Sequence

from engine.core.kv_spec import (cache_groups, group_counts, is_paged, kv_storage_dtype, layer_groups,
                                 split_pool, storage_array_dtype)
from offload.plan_types import PlacementPlan, PlanOptions

logger = logging.getLogger("ramlm.offload")


def torch_device(name: str):
    import torch
    return torch.device("cpu") if name == "torch-cpu" else torch.device(name)


class Placement:
    """A plan applied to a model: undo() restores the CPU model when keep_originals was set."""

    def __init__(self, model, plan: PlacementPlan, ctx=None, originals=None, patches=(), runner=None,
                 runner_kv=None, kv_tier=None):
        self.model, self.plan, self.ctx = model, plan, ctx
        self._originals, self._patches, self._runner, self._runner_kv = originals, list(patches), runner, runner_kv
        self.kv_tier = kv_tier  # offload.kv_tiers.HostKVTier when the plan has num_cpu_blocks

    def undo(self) -> None:
        if self.ctx is None:
            return
        if self._originals is None:
            raise RuntimeError("this placement dropped the CPU weights "
                               "(apply_plan(..., keep_originals=True) keeps them)")
        blocks, lm_head = self._originals
        self.model.blocks[:] = blocks
        self.model.lm_head = lm_head
        from offload.convert import set_item
        for obj, key, old in reversed(self._patches):
            set_item(obj, key, old)
        if self._runner is not None:
            for i, kv in self._runner_kv.items():
                self._runner.kv_caches[i] = kv
        self.model.placement = None
        self.model.kv_tier = self.kv_tier = None
        dev, self.ctx = self.ctx.device, None
        import gc
        gc.collect()
        if dev.type == "cuda":
            import torch
            torch.cuda.empty_cache()


def apply_plan(model, plan: PlacementPlan, *, num_blocks: int | Sequence[int], block_size: int,
               kv_cache_dtype: str = "auto", runner=None, keep_originals: bool = False) -> Placement:
    """Moves the plan's GPU layers (and output matrix) onto its device.

    Args:
        model: a DecoderModel from engine.model.loader.load_model (model.weights is its WeightSource).
        plan: from offload.plan for this model's weights.
        num_blocks, block_size, kv_cache_dtype: the KV pool (the same block ids as the runner's): one count,
            or one per cache group (core/kv_spec.cache_groups), each layer's cache sized by its group's.
        runner: a ModelRunner over this model: its kv_caches[i] of device-KV layers are swapped for the
            device tensors (without a runner, each device block owns its KV and ignores the numpy pair).
        keep_originals: keep the CPU blocks so Placement.undo() can restore them (benchmarks).
    """
    model.placement = plan
    if not plan.uses_gpu():
        return Placement(model, plan)
    if plan.num_layers != len(model.blocks):
        raise ValueError(f"the plan is for {plan.num_layers} layers, the model has {len(model.blocks)}")
    import torch
    from gpu_kernels.linear import DTYPES
    from gpu_kernels.modules import DeviceContext, OnDevice, _DeviceBlock
    from offload.convert import Converter

    ctx = DeviceContext(torch_device(plan.gpu_device), DTYPES[plan.compute_dtype])
    wd = plan.options.get("gpu_weight_dtype", "auto")
    conv = Converter(model, ctx, default_fmt=wd if wd in DTYPES else "packed")
    originals = (list(model.blocks), model.lm_head) if keep_originals else None
    kv_dtype = getattr(torch, storage_array_dtype(kv_storage_dtype(kv_cache_dtype)))
    # each layer's cache (V is K for MLA: one tensor; state pools for linear attention; a KV-shared layer: none)
    layout = model.kv_layout
    _check_shared_kv(plan.layers, layout)
    groups = layer_groups(layout)
    counts = (num_blocks,) * (max(groups) + 1) if isinstance(num_blocks, int) else tuple(num_blocks)
    patches, runner_kv, device_kv = [], {}, {}
    with torch.no_grad():
        for lp in plan.layers:
            i = lp.index
            if lp.device == "cpu":
                if any(d != "cpu" for d in lp.tensors_elsewhere.values()):
                    patches += conv.patch_cpu_block(model.blocks[i], i, lp)
                continue
            kv = None
            src = layout[i].shared_from
            if src >= 0:  # a KV-shared layer attends over its source layer's cache, wherever that is
                kv = device_kv.get(src)
                if runner is not None and kv is not None:
                    runner_kv[i], runner.kv_caches[i] = runner.kv_caches[i], kv
            elif lp.kv_device != "cpu":
                if is_paged(layout[i]):
                    shape = layout[i].block_shape(counts[groups[i]], block_size, kv_cache_dtype)
                    k = torch.zeros(shape, dtype=kv_dtype, device=ctx.device)
                    kv = (k, k if layout[i].v_is_k else torch.zeros(shape, dtype=kv_dtype, device=ctx.device))
                else:  # a linear-attention layer: its float32 state pools, one slot per state slot id
                    kv = tuple(torch.zeros(shape, dtype=torch.float32, device=ctx.device)
                               for shape in layout[i].pool_shapes(model.num_state_slots))
                device_kv[i] = kv
                if runner is not None:
                    runner_kv[i] = runner.kv_caches[i]
                    runner.kv_caches[i] = kv
            model.blocks[i] = conv.block(model.blocks[i], i, lp, kv)
        # Hidden states stay on the device between consecutive device blocks.
        for i, b in enumerate(model.blocks):
            if isinstance(b, _DeviceBlock):
                nxt = model.blocks[i + 1] if i + 1 < len(model.blocks) else None
                b.output_to_host = not (isinstance(nxt, _DeviceBlock) and nxt.ctx is b.ctx)
        if plan.output_device != "cpu":
            name = "token_embd.weight" if model.lm_head is model.embed else "output.weight"
            head = conv.linear(model.lm_head, name, _output_layer_plan(plan), fmt=plan.output_format, streamed=False)
            model.lm_head = OnDevice(head, ctx)
    tier = None
    if plan.kv.num_cpu_blocks and device_kv:
        from offload.kv_tiers import HostKVTier
        # A swapped block id is reused in every layer: with a runner, its RAM layers' KV moves too.
        tier = HostKVTier(plan.kv.num_cpu_blocks, paged_caches(layout, runner.kv_caches if runner else device_kv))
    model.kv_tier = tier
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    return Placement(model, plan, ctx, originals, patches, runner, runner_kv, tier)


def bind_runner(runner, model) -> int:
    """Points runner.kv_caches[i] at the device KV of each device block (the engine builds its runner after
    the load hook has applied the plan; the blocks work either way, this makes runner.kv_caches tell the
    truth and frees the untouched numpy pairs), and the RAM tier (model.kv_tier) at every paged layer's KV,
    since a swapped block id is reused in all of them. Returns how many layers were rebound."""
    n = 0
    for i, b in enumerate(model.blocks):
        kv = next((p.kv_cache for p in getattr(b, "parts", ()) if getattr(p, "kv_cache", None) is not None), None)
        if kv is not None and i < len(runner.kv_caches):
            runner.kv_caches[i] = kv
            n += 1
    tier = getattr(model, "kv_tier", None)
    if tier is not None:
        tier.bind(paged_caches(model.kv_layout, runner.kv_caches))
    return n


def _check_shared_kv(layers, layout) -> None:
    """A KV-shared layer reads its source layer's cache: from the device, or (a GPU layer over a source in RAM) from
    RAM through the host attention path; a CPU-side reader of a device cache is refused."""
    where = {lp.index: lp.kv_device if lp.device != "cpu" else "cpu" for lp in layers}
    for i, kv in enumerate(layout):
        src = kv.shared_from
        if src >= 0 and where.get(src, "cpu") != "cpu" and where.get(i) != where.get(src):
            raise ValueError(f"layer {i} reads layer {src}'s KV cache (KV sharing), which the plan keeps on "
                             f"{where[src]}, but layer {i} reads its KV from {where.get(i)}; place both alike "
                             "(--n-gpu-layers counts the last layers, so it covers both; or --kv-offload)")


def paged_caches(layout, caches) -> dict:
    """{layer: (K, V)} of the paged layers among caches (a list per layer, or a dict by layer): what the RAM tier
    swaps. A linear-attention layer's state pools are not blocks; its states are recomputed on preemption. A KV-shared
    layer's cache is its source's (swapped once, with the source)."""
    items = caches.items() if isinstance(caches, dict) else enumerate(caches)
    return {i: kv for i, kv in items if is_paged(layout[i]) and layout[i].shared_from < 0}


def _output_layer_plan(plan: PlacementPlan):
    from offload.plan_types import LayerPlan
    return LayerPlan(-1, plan.output_device, "device", plan.output_format, "cpu")


def placement_options(args, max_model_len: int, num_blocks: int) -> PlanOptions:
    return PlanOptions.from_args(args, max_model_len=max_model_len, kv_pool_blocks=num_blocks)


def group_blocks(args, model, max_model_len: int, num_blocks: int, planned: bool = False) -> tuple[int, ...]:
    """The pool of num_blocks blocks in every layer, per cache group. In RAM (core/kv_spec.split_pool) sliding groups
    get what max_num_seqs requests hold and the full ones the rest of the bytes; a GPU plan (planned) counted the
    full groups at num_blocks and the sliding ones at what they use (kv_spec.group_counts), which is what they get.
    num_gpu_blocks_override gives every group that many."""
    if getattr(args, "num_gpu_blocks_override", None):
        return (int(num_blocks),) * len(cache_groups(model.kv_layout))
    if planned:
        return group_counts(model.kv_layout, num_blocks, args.block_size, max_model_len, args.max_num_seqs,
                            args.max_num_batched_tokens)
    return split_pool(model.kv_layout, num_blocks, args.block_size, args.kv_cache_dtype, max_model_len,
                      args.max_num_seqs, args.max_num_batched_tokens)


def apply_placement(args, model, max_model_len: int, num_blocks: int) -> tuple[int, ...]:
    """The load hook: plan from EngineArgs and apply. Returns the KV blocks to allocate per cache group (the plan
    may shrink the pool to what fits beside the weights on the GPU; group_blocks splits it). No GPU asked for:
    returns at once, no torch."""
    opts = replace(placement_options(args, max_model_len, num_blocks),
                   num_state_slots=getattr(model, "num_state_slots", 0) or None)
    if not opts.wants_gpu():
        return group_blocks(args, model, max_model_len, num_blocks)
    from offload.devices import load_devices, normalize_device, probe_devices
    from offload.meta import model_meta
    from offload.planner import plan as make_plan
    if getattr(args, "devices_file", None):
        devices = load_devices(args.devices_file)
    else:
        only_cpu = opts.gpu_device is not None and normalize_device(opts.gpu_device) == "torch-cpu"
        devices = probe_devices(gpus=not only_cpu)
    p = make_plan(model_meta(model.weights), devices, opts)
    for r in p.reasons:
        logger.info("%s", r)
    for w in p.warnings:
        logger.warning("%s", w)
    if getattr(args, "batch_invariant", False) and p.uses_gpu():
        logger.warning("batch_invariant: layers on %s are not batch-invariant (torch picks kernels by shape)",
                       p.gpu_device)
    counts = group_blocks(args, model, max_model_len, p.kv.num_blocks, planned=p.uses_gpu())
    apply_plan(model, p, num_blocks=counts, block_size=args.block_size, kv_cache_dtype=args.kv_cache_dtype)
    return counts


__all__ = ["Placement", "apply_plan", "apply_placement", "bind_runner", "torch_device"]
