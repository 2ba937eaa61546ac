"""Shared by the quantized-checkpoint tests: the float reference folder and edited copies of a written checkpoint."""
from __future__ import annotations

import json
import os
import shutil

from safetensors.torch import load_file, save_file


def reference_folder(src: str, dst: str, decoded: dict) -> str:
    """A float folder holding the decoded values: transformers loads it with its own name conversions."""
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "config.json"), dst)
    save_file({k: v.contiguous() for k, v in decoded.items()}, os.path.join(dst, "model.safetensors"),
              metadata={"format": "pt"})
    return dst


def edited_copy(path: str, tmp_path, config=None, tensors=None) -> str:
    """A copy of the checkpoint at path with config(quantization_config) and tensors(the state dict) applied."""
    out = tmp_path / "edited"
    shutil.copytree(path, out)
    if config is not None:
        cfg = json.loads((out / "config.json").read_text())
        cfg["quantization_config"] = config(cfg["quantization_config"])
        (out / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = load_file(str(out / "model.safetensors"))
        tensors(t)
        save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return str(out)
