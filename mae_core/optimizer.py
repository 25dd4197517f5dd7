"""The step sizes ``η_t`` and the update maps ``U_t`` of the spec's procedure: the learning-rate
schedule as a function of the step, and the optimiser presets (with their capturable form).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .config import Config


def learning_rate(step: int, *, peak: float, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """η_t: linear warm-up to ``peak`` over ``warmup_steps``, then cosine to 0 or constant."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if schedule == "constant":
        return peak
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, config: Config, capturable: bool = False) -> torch.optim.Optimizer:
    """U_t as a named preset: AdamW as He et al. A.1 (β=0.9/0.95, decay 0.05 except norms,
    biases, tokens and positions) or plain SGD ``θ - η_t g``. ``capturable``: AdamW with
    ``capturable=True`` (SGD has no such switch; see :func:`make_capturable`)."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config.actual_lr, momentum=0.0, foreach=True)
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        skip = parameter.ndim <= 1 or name.endswith("token") or "positions" in name
        (no_decay if skip else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # torch 2.13's fused AdamW runs on the CPU and accepts capturable=True there (its kernel takes
    # the step counts and a tensor step size either way; the unfused capturable path refuses CPU
    # parameters), so one optimizer serves both devices.
    return torch.optim.AdamW(groups, lr=config.actual_lr, betas=(0.9, 0.95), fused=True, capturable=capturable)


def make_capturable(optimizer: torch.optim.Optimizer, lr: torch.Tensor) -> None:
    """Point every group's step size at the device tensor ``lr``, set AdamW's ``capturable``, and
    keep each step count a float32 tensor on its parameter's device, as capturable requires.
    Re-applied after a checkpoint is loaded: ``load_state_dict`` restores the saved groups' values."""
    for group in optimizer.param_groups:
        group["lr"] = lr
        if "capturable" in group:  # AdamW
            group["capturable"] = True
        for parameter in group["params"]:
            state = optimizer.state.get(parameter, {})
            if "step" in state:
                state["step"] = state["step"].to(device=parameter.device, dtype=torch.float32)


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with each step size as a number, as the eager loop saves it."""
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"] = float(group["lr"])
    return state

