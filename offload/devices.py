"""What memory this machine has: system RAM (psutil) and GPUs (through torch, imported only when probed).

Devices can be described in JSON instead of probed, to plan for another machine or to test:

    {"ram": {"total_gib": 64, "available_gib": 58},
     "gpus": [{"name": "cuda:0", "kind": "cuda", "description": "RTX 4070", "total_gib": 8,
               "free_gib": 7.6, "compute_capability": "8.9", "shared_with_host": false}],
     "probe": false}

Sizes take *_bytes or *_gib keys. With "probe": true the file only overrides the probed facts: its
"ram" keys replace the probed ones, and a GPU entry replaces the probed GPU of the same name.
"""
from __future__ import annotations

import json
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
        return {"ram": self.ram.to_dict(), "gpus": [g.to_dict() for g in self.gpus], "source": self.source}


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


def _size(d: dict, key: str, default: int) -> int:
    if f"{key}_bytes" in d:
        return int(d[f"{key}_bytes"])
    if f"{key}_gib" in d:
        return int(round(float(d[f"{key}_gib"]) * GIB))
    return default


def _device_from(d: dict, base: DeviceInfo | None, ram: bool) -> DeviceInfo:
    name = "cpu" if ram else normalize_device(d.get("name", base.name if base else "cuda:0"))
    kind = "ram" if ram else d.get("kind", base.kind if base else name.split(":")[0])
    total = _size(d, "total", base.total_bytes if base else 0)
    free = _size(d, "available" if ram else "free", _size(d, "free", base.free_bytes if base else total))
    if total <= 0:
        raise ValueError(f"device description {d!r}: needs total_gib or total_bytes")
    keep = {f: d[f] for f in ("shared_with_host", "coherent_host_access", "compute_capability", "description")
            if f in d}
    info = base if base is not None else DeviceInfo(name, kind, total, free)
    return replace(info, name=name, kind=kind, total_bytes=total, free_bytes=min(free, total), **keep)


def devices_from_dict(desc: dict, source: str = "description") -> Devices:
    """A Devices from a description (see the module doc)."""
    base = probe_devices() if desc.get("probe") else None
    ram = _device_from(desc.get("ram", {}), base.ram if base else None, True) if "ram" in desc or base is None \
        else base.ram
    gpus = list(base.gpus) if base else []
    for g in desc.get("gpus", []):
        name = normalize_device(g.get("name", f"cuda:{len(gpus)}"))
        old = next((x for x in gpus if x.name == name), None)
        new = _device_from(dict(g, name=name), old, False)
        gpus = [new if x is old else x for x in gpus] if old else gpus + [new]
    return Devices(ram, tuple(gpus), source)


def load_devices(path: str | os.PathLike) -> Devices:
    """Devices from a JSON description file."""
    with open(path, encoding="utf-8") as f:
        return devices_from_dict(json.load(f), source=os.fspath(path))


__all__ = ["DeviceInfo", "Devices", "GIB", "devices_from_dict", "load_devices", "normalize_device", "probe_devices",
           "probe_gpus", "probe_ram", "torch_cpu_device"]
