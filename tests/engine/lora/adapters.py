"""Tiny PEFT LoRA adapters over the tiny random models (tests/model/tiny_models.py), saved as PEFT saves them, with
PEFT's own logits as the reference."""
from __future__ import annotations

import copy

import numpy as np
import torch

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
EVERY = ATTENTION + MLP + ["embed_tokens", "lm_head"]


def save_adapter(base, folder, targets, seed: int, r: int = 8, alpha: float = 16.0, **config):
    """A random LoRA of `base` (a transformers model, left unchanged) over `targets`, saved into folder; returns the
    PEFT model (eval) for references."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(seed)
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                                                           init_lora_weights=False, **config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:  # B is zero at PEFT's init: random both, so that every update shows
                p.normal_(0.0, 0.05)
    model.save_pretrained(folder)
    return model


@torch.no_grad()
def peft_logits(model, ids: list[int]) -> np.ndarray:
    return model(torch.tensor([ids])).logits[0].float().numpy()


def rel_err(a, b) -> float:
    return float(np.abs(np.asarray(a) - b).max() / np.abs(b).max())
