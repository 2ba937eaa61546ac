"""Numpy modules of engine/model -> their gpu_kernels twins, following one layer's LayerPlan.

The converters know engine/model's module classes and which GGUF tensor each Linear was read from
(attention q/k/v/o, MLP gate/up/down, MoE router + stacked experts). A new block class gets a device
port by adding an entry to blocks(); a block without one cannot be placed on a GPU (a clear error).
"""
from __future__ import annotations

from gpu_kernels.linear import DeviceLinear, DeviceWeight, typed_raw
from gpu_kernels.dequant import has_device_dequant
from gpu_kernels import modules as dm

ATTN_TENSORS = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output"}
MLP_TENSORS = {"gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}


class Converter:
    """Builds device modules for one model on one DeviceContext."""

    def __init__(self, model, ctx: dm.DeviceContext, default_fmt: str = "packed"):
        self.model, self.ctx, self.ws = model, ctx, model.weights
        self.default_fmt = default_fmt  # for tensors of CPU layers overridden onto the device

    # ---- leaves
    def tensor_device(self, lp, name: str) -> str:
        return lp.tensors_elsewhere.get(name, lp.device)

    def linear(self, lin, name: str, lp, fmt: str | None = None, streamed: bool | None = None):
        """A device Linear for tensor `name` (its bias too), or None when the plan keeps it in RAM."""
        if self.tensor_device(lp, name) == "cpu":
            return None
        fmt = fmt or (lp.weight_format if lp.device != "cpu" else self.default_fmt)
        streamed = (lp.weights == "streamed") if streamed is None else streamed
        raw = self.ws.raw(name) if fmt == "packed" else None
        w = DeviceWeight.build(lin.weight, raw, fmt, self.ctx.device, self.ctx.compute_dtype, streamed)
        bias = None if lin.bias is None else dm.vector(lin.bias, self.ctx.device)
        return DeviceLinear(w, bias)

    def leaf(self, lin, name: str, lp):
        """Inside a device block: a device Linear, or the numpy one run from RAM."""
        d = self.linear(lin, name, lp)
        return d if d is not None else dm.HostModule(lin, self.ctx)

    def norm(self, n):
        return None if n is None else dm.DeviceRMSNorm(n.weight, n.eps, self.ctx.device)

    def stacked_experts(self, moe, layer: int, lp) -> list:
        """(gate, up, down) DeviceLinears per expert; packed: one device tensor per stacked GGUF tensor."""
        p = f"blk.{layer}."
        names = [p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight", p + "ffn_down_exps.weight"]
        fmt, streamed = lp.weight_format, lp.weights == "streamed"
        per_proj = []
        for j, name in enumerate(names):
            info = self.ws.info(name)
            E, N, K = info.shape
            if fmt == "packed" and has_device_dequant(info.ggml_type):
                data = typed_raw(self.ws.raw(name).reshape(E, N, -1), info.ggml_type)
                if not streamed:
                    data = data.to(self.ctx.device)
                elif self.ctx.device.type == "cuda":
                    data = data.pin_memory()
                per_proj.append([DeviceLinear(DeviceWeight(data[e], "packed", info.ggml_type, N, K, self.ctx.device,
                                                           self.ctx.compute_dtype, streamed)) for e in range(E)])
            else:
                per_proj.append([DeviceLinear(DeviceWeight.build(moe.experts[e][j].weight, None, fmt, self.ctx.device,
                                                                 self.ctx.compute_dtype, streamed)) for e in range(E)])
        return [tuple(proj[e] for proj in per_proj) for e in range(len(per_proj[0]))]

    # ---- modules
    def attention(self, a, layer: int, lp, kv_cache=None):
        p = f"blk.{layer}."
        leaves = {k: self.leaf(getattr(a, k), p + t + ".weight", lp) for k, t in ATTN_TENSORS.items()}
        return dm.DeviceAttention(a, leaves["q"], leaves["k"], leaves["v"], leaves["o"], self.norm(a.q_norm),
                                  self.norm(a.k_norm), self.ctx, kv_cache=kv_cache, kv_on_host=lp.kv_device == "cpu")

    def mlp(self, mlp, layer: int, lp):
        from cpu_kernels import activations
        from engine.model.layers import GatedMLP
        from engine.model.qwen3moe import MoE
        p = f"blk.{layer}."
        if isinstance(mlp, GatedMLP):
            leaves = {k: self.leaf(getattr(mlp, k), p + t + ".weight", lp) for k, t in MLP_TENSORS.items()}
            act = "gelu_tanh" if mlp.act is activations.gelu_tanh_mul else "silu"
            return dm.DeviceGatedMLP(leaves["gate"], leaves["up"], leaves["down"], act)
        if isinstance(mlp, MoE):
            if self.tensor_device(lp, p + "ffn_gate_exps.weight") == "cpu":
                return dm.HostModule(mlp, self.ctx)  # experts (and their router) stay in RAM
            router = self.linear(mlp.router, p + "ffn_gate_inp.weight", lp, fmt="float32", streamed=False)
            return dm.DeviceMoE(router, self.stacked_experts(mlp, layer, lp), mlp.top_k, mlp.norm_topk_prob)
        raise NotImplementedError(f"layer {layer}: {type(mlp).__name__} has no device port")

    def block(self, blk, layer: int, lp, kv_cache=None):
        for cls, fn in blocks().items():
            if type(blk) is cls:
                return fn(self, blk, layer, lp, kv_cache)
        raise NotImplementedError(f"layer {layer}: {type(blk).__name__} has no device port; keep it on the CPU "
                                  "(lower --n-gpu-layers)")

    def patch_cpu_block(self, blk, layer: int, lp) -> list[tuple[object, str, object]]:
        """A CPU layer with tensors overridden onto the device: swap those leaves for OnDevice wrappers.
        Returns (object, attribute, old value) for undo."""
        from engine.model.qwen3moe import MoE
        p = f"blk.{layer}."
        patches = []
        on_dev = {n for n, d in lp.tensors_elsewhere.items() if d != "cpu"}
        for k, t in ATTN_TENSORS.items():
            if p + t + ".weight" in on_dev:
                patches.append((blk.attn, k, dm.OnDevice(self.linear(getattr(blk.attn, k), p + t + ".weight", lp),
                                                         self.ctx)))
        if isinstance(blk.mlp, MoE):
            if p + "ffn_gate_exps.weight" in on_dev:
                dev_lp = _as_device(lp, self.default_fmt)
                patches.append((blk, "mlp", dm.OnDevice(self.mlp(blk.mlp, layer, dev_lp), self.ctx)))
        else:
            for k, t in MLP_TENSORS.items():
                if p + t + ".weight" in on_dev:
                    patches.append((blk.mlp, k, dm.OnDevice(self.linear(getattr(blk.mlp, k), p + t + ".weight", lp),
                                                            self.ctx)))
        out = []
        for obj, attr, new in patches:
            out.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, new)
        return out


def _as_device(lp, fmt: str):
    """The LayerPlan seen from a module moved onto the device: its own tensors there, in `fmt`."""
    from dataclasses import replace
    on = {n: d for n, d in lp.tensors_elsewhere.items() if d != "cpu"}
    dev = next(iter(on.values()))
    return replace(lp, device=dev, weights="device", weight_format=fmt, kv_device="cpu", tensors_elsewhere={})


def _prenorm(conv: Converter, blk, layer, lp, kv_cache):
    return dm.DevicePreNormBlock(conv.ctx, layer, conv.attention(blk.attn, layer, lp, kv_cache),
                                 conv.mlp(blk.mlp, layer, lp), conv.norm(blk.attn_norm), conv.norm(blk.ffn_norm))


def _sandwich(conv: Converter, blk, layer, lp, kv_cache):
    norms = [conv.norm(n) for n in (blk.attn_norm, blk.post_attn_norm, blk.ffn_norm, blk.post_ffn_norm)]
    return dm.DeviceSandwichBlock(conv.ctx, layer, conv.attention(blk.attn, layer, lp, kv_cache),
                                  conv.mlp(blk.mlp, layer, lp), norms)


def blocks() -> dict:
    """CPU block class -> converter (imported lazily: engine/model need not be imported for the kernels)."""
    from engine.model.gemma3 import SandwichBlock
    from engine.model.llama import PreNormBlock
    return {PreNormBlock: _prenorm, SandwichBlock: _sandwich}
