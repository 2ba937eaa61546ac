"""Hybrid placement: device probing, the placement planner, applying a plan to a loaded model.

Importing this package imports neither torch nor any GPU runtime: devices are probed, and torch
modules built, only when a plan asks for a GPU.
"""
from offload.devices import Devices, DeviceInfo, load_devices, probe_devices
from offload.meta import ModelMeta, model_meta, model_meta_from_path, synthetic_meta
from offload.plan_types import PlacementPlan, PlanOptions
from offload.planner import plan


def apply_plan(*args, **kwargs):
    """offload.apply.apply_plan (imported on first use)."""
    from offload.apply import apply_plan as _apply
    return _apply(*args, **kwargs)


def apply_placement(args, model, max_model_len: int, num_blocks: int) -> tuple[int, ...]:
    """offload.apply.apply_placement: the load hook (see engine/loading.py); blocks per cache group."""
    from offload.apply import apply_placement as _apply
    return _apply(args, model, max_model_len, num_blocks)


__all__ = ["Devices", "DeviceInfo", "ModelMeta", "PlacementPlan", "PlanOptions", "apply_placement", "apply_plan",
           "load_devices", "model_meta", "model_meta_from_path", "plan", "probe_devices", "synthetic_meta"]
