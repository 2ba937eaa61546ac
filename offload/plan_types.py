"""PlacementPlan and its parts: plain frozen data, JSON in and out (the same input gives the same JSON)."""
from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import asdict, dataclass, field, fields

GIB = 1 << 30
WEIGHT_DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "fp16": "float16", "f16": "float16", "half": "float16",
                        "bf16": "bfloat16", "q": "packed", "gguf": "packed"}


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class PlanOptions:
    """The user's placement controls (EngineArgs fields of the same names) and the sizes they act on."""
    n_gpu_layers: str = "0"             # N | auto | all (llama.cpp's -ngl)
    gpu_device: str | None = None       # cuda:0, xpu:0, mps, cpu (torch's CPU device); None: first GPU
    gpu_memory_utilization: float = 0.9
    cpu_offload_gb: float = 0.0         # weights kept in RAM and streamed to the GPU each step (vLLM's)
    override_tensor: tuple[tuple[str, str], ...] = ()  # (regex, device), first match wins (llama.cpp's -ot)
    kv_offload: bool = False            # KV of GPU layers stays in RAM (attention there, llama.cpp's -nkvo)
    num_cpu_blocks: int = 0             # RAM tier behind the GPU KV blocks
    gpu_weight_dtype: str = "auto"      # auto | float32 | float16 | bfloat16 | packed
    dtype: str = "auto"                 # vLLM's activation dtype: float32/bfloat16 fix the GPU layers' compute type
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    # Whether the user chose max_model_len (None: it was given iff max_model_len is). `auto` keeps room for one
    # request of a chosen length; an unchosen (model-default) one may shrink to FIT_MIN_TOKENS, as llama.cpp's --fit.
    max_model_len_set: bool | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    num_gpu_blocks_override: int | None = None
    kv_pool_blocks: int | None = None   # the engine's KV pool sized for RAM (the load hook passes it)
    num_state_slots: int | None = None  # hybrid models: the engine's state slots (None: max_num_seqs + 1)
    kv_cache_memory: float | None = None

    @classmethod
    def from_args(cls, args=None, **kw) -> "PlanOptions":
        """From EngineArgs (or any object with these attribute names) plus keyword overrides."""
        vals = {}
        for f in fields(cls):
            if f.name in kw:
                vals[f.name] = kw[f.name]
            elif args is not None and hasattr(args, f.name):
                vals[f.name] = getattr(args, f.name)
        if "max_model_len_set" not in vals and args is not None and hasattr(args, "max_model_len"):
            # The load hook passes the resolved length; whether the user chose it is in the EngineArgs.
            vals["max_model_len_set"] = getattr(args, "max_model_len") is not None
        if "override_tensor" in vals:
            vals["override_tensor"] = parse_overrides(vals["override_tensor"])
        if vals.get("n_gpu_layers") is None:
            vals["n_gpu_layers"] = "0"
        ngl = str(vals["n_gpu_layers"]).strip().lower()
        vals["n_gpu_layers"] = str(int(ngl)) if ngl.isdigit() else ngl  # "08" -> "8"
        for name in ("cpu_offload_gb", "gpu_memory_utilization"):
            if vals.get(name) is None:
                vals.pop(name, None)
        if vals.get("num_cpu_blocks") is None:
            vals.pop("num_cpu_blocks", None)
        if vals.get("dtype") == "float":
            vals["dtype"] = "float32"
        if "gpu_weight_dtype" in vals:
            wd = str(vals["gpu_weight_dtype"] or "auto").lower()
            vals["gpu_weight_dtype"] = WEIGHT_DTYPE_ALIASES.get(wd, wd)
        return cls(**vals)

    def __post_init__(self):
        """Refuses what no plan can mean, whether or not a GPU is asked for (nothing is accepted and ignored)."""
        from offload.devices import normalize_device
        if self.max_model_len_set is None:
            object.__setattr__(self, "max_model_len_set", self.max_model_len is not None)
        n = self.n_gpu_layers
        if n not in ("auto", "all") and not n.isdigit():
            raise ValueError(f"n_gpu_layers must be a number >= 0, 'auto' or 'all', got {n!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not 0 <= self.cpu_offload_gb < math.inf:
            raise ValueError(f"cpu_offload_gb must be a number of GiB >= 0, got {self.cpu_offload_gb}")
        if isinstance(self.num_cpu_blocks, bool) or not isinstance(self.num_cpu_blocks, numbers.Integral) \
                or self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be a whole number >= 0, got {self.num_cpu_blocks!r}")
        if self.gpu_weight_dtype not in ("auto", "packed", "float32", "float16", "bfloat16"):
            raise ValueError(f"gpu_weight_dtype must be auto, packed, float32, float16 or bfloat16, "
                             f"got {self.gpu_weight_dtype!r}")
        if self.gpu_device is not None and not re.match(r"^(torch-cpu|mps|(cuda|xpu):\d+)$",
                                                        normalize_device(str(self.gpu_device))):
            raise ValueError(f"gpu_device {self.gpu_device!r} is not a device name (cuda:0, rocm:0, xpu:0, mps, or "
                             "cpu for torch's CPU device)")

    def wants_gpu(self) -> bool:
        """Whether anything is asked to run on a GPU (else the plan is all-CPU and no torch is touched)."""
        if self.n_gpu_layers != "0":
            return True
        return any(dev != "cpu" for _, dev in self.override_tensor)


def parse_overrides(spec) -> tuple[tuple[str, str], ...]:
    """"exps=CPU,attn_.*=CUDA0" (or a list of "REGEX=DEVICE") -> ((regex, device), ...); device is "cpu"
    or a GPU name (CUDA0 -> cuda:0; GPU -> the plan's GPU)."""
    from offload.devices import normalize_device
    if not spec:
        return ()
    if isinstance(spec, str):
        items = [s for s in spec.split(",") if s.strip()]
    else:
        items = list(spec)
    out = []
    for it in items:
        if isinstance(it, (tuple, list)):
            pat, dev = it
        else:
            if "=" not in it:
                raise ValueError(f"--override-tensor {it!r}: expected REGEX=DEVICE (e.g. exps=CPU)")
            pat, dev = it.rsplit("=", 1)
        dev = dev.strip()
        low = dev.lower()
        if low == "cpu":
            target = "cpu"
        elif low in ("gpu", "device"):
            target = "gpu"
        else:
            target = normalize_device(dev)
            if target == dev and ":" not in target and target != "mps":
                raise ValueError(f"--override-tensor {it!r}: unknown device {dev!r} (CPU, GPU, CUDA0, cuda:1, ...)")
        try:
            re.compile(pat.strip())
        except re.error as e:
            raise ValueError(f"--override-tensor {it!r}: bad regex: {e}") from None
        out.append((pat.strip(), target))
    return tuple(out)


@dataclass(frozen=True)
class LayerPlan:
    """One decoder layer.

    device: where it computes ("cpu": Numba kernels on RAM; else a torch device).
    weights: "ram" | "device" | "streamed" (kept in RAM, copied to the device at each step).
    weight_format: "native" (cpu_kernels' repacked GGUF), "packed" (GGUF blocks on the device,
        dequantized per matmul) or the dtype they were dequantized to once (float32/float16/bfloat16).
    kv_device: where its KV blocks live.
    tensors_elsewhere: tensor -> device, for tensors not on `device` (overrides, experts in RAM).
    bytes: device -> bytes of this layer's weights there.
    """
    index: int
    device: str
    weights: str
    weight_format: str
    kv_device: str
    tensors_elsewhere: dict = field(default_factory=dict)
    bytes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class KVPlan:
    block_size: int
    dtype: str
    num_blocks: int                 # blocks per layer (one block id space for all layers), null block included
    tokens: int                     # num_blocks * block_size
    bytes_per_block_per_layer: int  # the largest layer's (Gemma 4's layers differ; the sums count each its own)
    layers_by_device: dict          # device -> layers whose KV is there
    num_cpu_blocks: int = 0         # RAM tier behind the GPU blocks
    limited_by: str = ""


@dataclass(frozen=True)
class DeviceUsage:
    device: str
    budget: int
    weights: int = 0
    kv: int = 0
    work: int = 0
    margin: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.work + self.margin


@dataclass(frozen=True)
class PlacementPlan:
    """Where everything goes. JSON: to_json() / from_json(); plan() builds it, offload.apply applies it."""
    model: str
    arch: str
    num_layers: int
    gpu_device: str | None          # the one GPU this plan uses (None: all on the CPU)
    gpu_kind: str
    shared_memory: bool             # the GPU's memory is system RAM
    compute_dtype: str              # of the GPU layers' matmuls
    embed_device: str
    output_device: str
    output_format: str
    layers: tuple[LayerPlan, ...]
    kv: KVPlan
    usage: tuple[DeviceUsage, ...]
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    options: dict

    def gpu_layers(self) -> list[int]:
        return [lp.index for lp in self.layers if lp.device != "cpu"]

    def uses_gpu(self) -> bool:
        return bool(self.gpu_layers()) or self.output_device != "cpu" or any(
            d != "cpu" for lp in self.layers for d in lp.tensors_elsewhere.values())

    def usage_of(self, device: str) -> DeviceUsage | None:
        return next((u for u in self.usage if u.device == device), None)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["usage"] = [dict(asdict(u), total=u.total) for u in self.usage]
        return d

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "PlacementPlan":
        d = dict(d)
        d["layers"] = tuple(LayerPlan(**lp) for lp in d["layers"])
        d["kv"] = KVPlan(**d["kv"])
        d["usage"] = tuple(DeviceUsage(**{k: v for k, v in u.items() if k != "total"}) for u in d["usage"])
        d["reasons"], d["warnings"] = tuple(d["reasons"]), tuple(d["warnings"])
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "PlacementPlan":
        return cls.from_dict(json.loads(text))
