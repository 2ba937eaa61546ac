"""What memory this machine has: system RAM (psutil) and GPUs (through torch, imported only when probed).

Devices can be described in JSON instead of probed, to plan for another machine or to test:

    {"ram": {"total_gib": 64, "available_gib": 58},
     "gpus": [{"name": "cuda:0", "kind": "cuda", "description": "RTX 4070", "total_gib": 8,
               "free_gib": 7.6, "compute_capability": "8.9", "shared_with_host": false}],
     "probe": false}

Sizes take *_bytes or *_gib keys. With "probe": true the file only overrides the probed facts: its
"ram" keys replace the probed ones, and a GPU entry replaces the probed GPU of the same name. Unknown
keys, GPU kinds or names, negative sizes and malformed JSON are refused with a ValueError naming the file
and the entry.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, replace

GIB = 1 << 30

# Names of GPUs that share one memory with the CPU (APUs, SoCs) or read host RAM coherently at high
# speed (Grace Hopper / Grace Blackwell). torch reports neither reliably, so names and archs decide.
SHARED_NAMES = ("GB10", "Jetson", "Orin", "Thor", "Radeon 8060S", "Radeon 8050S", "Radeon 890M", "Radeon 880M",
                "Radeon 780M", "Radeon 760M", "Radeon Graphics", "Apple")
SHARED_ARCHS = ("gfx1150", "gfx1151", "gfx1152", "gfx1103", "gfx1035", "gfx1036", "gfx1037", "gfx90c", "gfx902")
COHERENT_NAMES = ("GH200", "GB200", "GB300")


@dataclass(frozen=True)
class DeviceInfo:
    """One memory pool with compute attached.

    name: "cpu" for system RAM (Numba kernels); a torch device for GPUs ("cuda:0" also on ROCm, "xpu:0",
    "mps"); "torch-cpu" for torch's CPU device standing in for a GPU.
    kind: ram | cuda | rocm | xpu | mps | torch-cpu.
    shared_with_host: the GPU's memory is system RAM (APU, Apple silicon, GB10): placing weights on it
        frees no RAM. coherent_host_access: the GPU reads RAM coherently over a fast link (GH200/GB200):
        weights left in RAM are cheap to stream.
    compute_capability: "9.0" for CUDA, the gfx arch for ROCm, "" otherwise.
    """
    name: str
    kind: str
    total_bytes: int
    free_bytes: int
    shared_with_host: bool = False
    coherent_host_access: bool = False
    compute_capability: str = ""
    description: str = ""

    def supports_bf16(self) -> bool:
        if self.kind == "cuda":
            try:
                return int(self.compute_capability.split(".")[0]) >= 8
            except ValueError:
                return False
        return self.kind in ("rocm", "xpu", "torch-cpu")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Devices:
    """RAM and the GPUs of one machine (probed or described)."""
    ram: DeviceInfo
    gpus: tuple[DeviceInfo, ...] = ()
    source: str = "probed"
    absent: tuple[str, ...] = ()  # described GPUs torch does not see on this machine (load_devices)

    def gpu(self, name: str | None) -> DeviceInfo | None:
        """The GPU called `name` ("cuda" means cuda:0; None: the first GPU; "cpu": torch's CPU device)."""
        if name is None:
            return self.gpus[0] if self.gpus else None
        name = normalize_device(name)
        if name == "torch-cpu":
            return torch_cpu_device(self.ram)
        for g in self.gpus:
            if g.name == name:
                return g
        return None

    def to_dict(self) -> dict:
        return {"ram": self.ram.to_dict(), "gpus": [g.to_dict() for g in self.gpus], "source": self.source,
                "absent": list(self.absent)}


def normalize_device(name: str) -> str:
    """User spellings -> device names: cpu -> torch-cpu (the GPU path on torch's CPU device), cuda -> cuda:0,
    CUDA1 (llama.cpp) -> cuda:1, rocm:0 -> cuda:0 (torch's ROCm build calls its devices cuda)."""
    n = name.strip()
    low = n.lower()
    if low in ("cpu", "torch-cpu", "torch:cpu"):
        return "torch-cpu"
    for prefix in ("cuda", "rocm", "hip", "xpu"):
        if low.startswith(prefix):
            rest = low[len(prefix):].lstrip(":") or "0"
            return f"{'xpu' if prefix == 'xpu' else 'cuda'}:{rest}"
    if low.startswith("mps") or low == "metal":
        return "mps"
    return n


def torch_cpu_device(ram: DeviceInfo) -> DeviceInfo:
    return DeviceInfo("torch-cpu", "torch-cpu", ram.total_bytes, ram.free_bytes, shared_with_host=True,
                      description="torch CPU device (the GPU code path, run on the CPU)")


def probe_ram() -> DeviceInfo:
    import psutil
    vm = psutil.virtual_memory()
    return DeviceInfo("cpu", "ram", int(vm.total), int(vm.available), description="system RAM")


def _looks_shared(name: str, arch: str = "", integrated: bool = False) -> bool:
    return integrated or any(s.lower() in name.lower() for s in SHARED_NAMES) or arch.split(":")[0] in SHARED_ARCHS


def _probe_cuda(torch) -> list[DeviceInfo]:
    out = []
    rocm = getattr(torch.version, "hip", None) is not None
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        arch = getattr(p, "gcnArchName", "") if rocm else ""
        cc = arch if rocm else f"{p.major}.{p.minor}"
        shared = _looks_shared(p.name, arch, bool(getattr(p, "is_integrated", False)))
        coherent = any(s in p.name for s in COHERENT_NAMES)
        out.append(DeviceInfo(f"cuda:{i}", "rocm" if rocm else "cuda", int(total), int(free), shared, coherent, cc,
                              p.name))
    return out


def _probe_xpu(torch) -> list[DeviceInfo]:
    out = []
    for i in range(torch.xpu.device_count()):
        p = torch.xpu.get_device_properties(i)
        total = int(p.total_memory)
        try:
            free = int(torch.xpu.mem_get_info(i)[0])
        except Exception:  # older torch: no mem_get_info on XPU
            free = total
        # Integrated: "Intel(R) Graphics", "Intel(R) Arc(TM) Graphics"; discrete: "Arc(TM) A770 Graphics", "GPU Max".
        shared = "Graphics" in p.name and re.search(r"Arc\(TM\) [AB]\d", p.name) is None
        out.append(DeviceInfo(f"xpu:{i}", "xpu", total, free, shared, False, "", p.name))
    return out


def _probe_mps(torch, ram: DeviceInfo) -> list[DeviceInfo]:
    total = int(torch.mps.recommended_max_memory()) if hasattr(torch.mps, "recommended_max_memory") else ram.total_bytes
    used = int(torch.mps.driver_allocated_memory()) if hasattr(torch.mps, "driver_allocated_memory") else 0
    return [DeviceInfo("mps", "mps", total, max(0, min(total - used, ram.free_bytes)), True, False, "",
                       "Apple silicon GPU (unified memory)")]


def probe_gpus(ram: DeviceInfo | None = None) -> list[DeviceInfo]:
    """GPUs torch can use; [] when torch or a GPU runtime is missing. Imports torch here, not at import."""
    try:
        import torch
    except ImportError:
        return []
    gpus: list[DeviceInfo] = []
    if torch.cuda.is_available():
        gpus += _probe_cuda(torch)
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        gpus += _probe_xpu(torch)
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        gpus += _probe_mps(torch, ram or probe_ram())
    return gpus


def probe_devices(gpus: bool = True) -> Devices:
    ram = probe_ram()
    return Devices(ram, tuple(probe_gpus(ram)) if gpus else (), "probed")


# What a description may say (anything else is refused, so a typo such as "total_gb" is not silently dropped).
TOP_KEYS = ("ram", "gpus", "probe")
RAM_KEYS = ("total_gib", "total_bytes", "available_gib", "available_bytes", "free_gib", "free_bytes", "description")
GPU_KEYS = ("name", "kind", "description", "total_gib", "total_bytes", "free_gib", "free_bytes", "compute_capability",
            "shared_with_host", "coherent_host_access")
# GPU kind -> the torch device type of its name (torch's ROCm build calls its devices cuda:N).
GPU_KINDS = {"cuda": "cuda", "rocm": "cuda", "xpu": "xpu", "mps": "mps"}
_GPU_NAME = re.compile(r"^(cuda|xpu):\d+$|^mps$")


class _Described:
    """Reads one description, naming where it came from in every error."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, what: str):
        raise ValueError(f"{self.source}: {what}")

    def obj(self, d, where: str, keys: tuple[str, ...]) -> dict:
        if not isinstance(d, dict):
            self.fail(f"{where} must be a JSON object, got {type(d).__name__} {json.dumps(d)[:60]}")
        unknown = sorted(set(d) - set(keys))
        if unknown:
            self.fail(f"{where} has unknown key(s) {', '.join(unknown)}; known: {', '.join(keys)}")
        return d

    def size(self, d: dict, where: str, key: str, default: int) -> int:
        for unit, scale in (("bytes", 1), ("gib", GIB)):
            k = f"{key}_{unit}"
            if k in d:
                v = d[k]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    self.fail(f"{where}.{k} must be a number >= 0, got {json.dumps(v)}")
                return int(round(v * scale))
        return default

    def flag(self, d: dict, where: str, key: str, typ: type):
        if key in d and not isinstance(d[key], typ):
            self.fail(f"{where}.{key} must be a JSON {'boolean' if typ is bool else 'string'}, got {json.dumps(d[key])}")

    def gpu_name(self, g: dict, where: str, default: str) -> str:
        raw = g.get("name", default)
        if not isinstance(raw, str):
            self.fail(f"{where}.name must be a string, got {json.dumps(raw)}")
        name = normalize_device(raw)
        if not _GPU_NAME.match(name):
            self.fail(f"{where}.name {raw!r} is not a GPU name (cuda:N, rocm:N, xpu:N or mps; torch's CPU device is "
                      "not described, --gpu-device cpu selects it)")
        return name

    def device(self, d: dict, where: str, base: DeviceInfo | None, ram: bool) -> DeviceInfo:
        d = self.obj(d, where, RAM_KEYS if ram else GPU_KEYS)
        for key, typ in (("shared_with_host", bool), ("coherent_host_access", bool), ("compute_capability", str),
                         ("description", str)):
            self.flag(d, where, key, typ)
        name = "cpu" if ram else d["name"]
        if ram:
            kind = "ram"
        else:
            kind = d.get("kind", base.kind if base else name.split(":")[0])
            if kind not in GPU_KINDS:
                self.fail(f"{where}.kind {kind!r} is not a GPU kind (known: {', '.join(GPU_KINDS)})")
            if GPU_KINDS[kind] != name.split(":")[0]:
                self.fail(f"{where}: a {kind} GPU is called {GPU_KINDS[kind]}{':N' if kind != 'mps' else ''}, "
                          f"not {name}")
        total = self.size(d, where, "total", base.total_bytes if base else 0)
        free_key = "available" if ram and ("available_gib" in d or "available_bytes" in d) else "free"
        free = self.size(d, where, free_key, base.free_bytes if base else total)
        if total <= 0:
            self.fail(f"{where} needs total_gib or total_bytes (> 0)")
        keep = {f: d[f] for f in ("shared_with_host", "coherent_host_access", "compute_capability", "description")
                if f in d}
        info = base if base is not None else DeviceInfo(name, kind, total, free)
        return replace(info, name=name, kind=kind, total_bytes=total, free_bytes=min(free, total), **keep)


def devices_from_dict(desc, source: str = "device description") -> Devices:
    """A Devices from a description (see the module doc); ValueError naming `source` and the bad entry."""
    r = _Described(source)
    if not isinstance(desc, dict):
        r.fail(f'expected a JSON object such as {{"ram": {{...}}, "gpus": [...]}}, got {type(desc).__name__} '
               f"{json.dumps(desc)[:60]}")
    desc = r.obj(desc, "the description", TOP_KEYS)
    r.flag(desc, "the description", "probe", bool)
    base = probe_devices() if desc.get("probe") else None
    ram = r.device(desc["ram"], "ram", base.ram if base else None, True) if "ram" in desc or base is None \
        else base.ram
    entries = desc.get("gpus", [])
    if not isinstance(entries, list):
        r.fail(f"gpus must be a JSON list, got {json.dumps(entries)[:60]}")
    gpus = list(base.gpus) if base else []
    seen = set()
    for i, g in enumerate(entries):
        where = f"gpus[{i}]"
        r.obj(g, where, GPU_KEYS)
        name = r.gpu_name(g, where, f"cuda:{len(gpus)}")
        if name in seen:
            r.fail(f"{where}: {name} is described twice")
        seen.add(name)
        old = next((x for x in gpus if x.name == name), None)
        new = r.device(dict(g, name=name), where, old, False)
        gpus = [new if x is old else x for x in gpus] if old else gpus + [new]
    return Devices(ram, tuple(gpus), source)


def load_devices(path: str | os.PathLike, on_this_machine: bool = True) -> Devices:
    """Devices from a JSON description file; ValueError (naming the file) when it is missing or malformed.

    on_this_machine: the plan will run here (the engine, the offload bench): described GPUs that torch does
    not see are listed in Devices.absent, and the planner refuses to put anything on them. False plans for
    another machine (`ramlm plan`): nothing is probed."""
    where = f"devices file {os.fspath(path)}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        desc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    devices = devices_from_dict(desc, source=where)
    if not on_this_machine:
        return devices
    here = {g.name for g in probe_gpus(devices.ram)}
    return replace(devices, absent=tuple(g.name for g in devices.gpus if g.name not in here))


__all__ = ["DeviceInfo", "Devices", "GIB", "devices_from_dict", "load_devices", "normalize_device", "probe_devices",
           "probe_gpus", "probe_ram", "torch_cpu_device"]
