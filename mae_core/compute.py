"""What a trial's pretraining costs: parameters, FLOPs of one update, updates per second.

``update_flops`` counts one training update's forward and backward pass with torch's
:class:`~torch.utils.flop_counter.FlopCounterMode` on one representative batch: the first
``batch_size`` pretraining images (cycled when there are fewer), their visible sets drawn from a
generator of their own. The count depends only on the shapes (B, M, k, q and the model), so it
is the count of every update of the run. It runs outside the training loop, on the trained
model, with ``torch.autograd.grad`` (no ``.grad`` is written), under a forked RNG: the run's
sampler, global RNG, weights and results are untouched. The optimiser's step is not counted
(FlopCounterMode counts matrix products, convolutions and attention; AdamW's elementwise work
is a few FLOPs per parameter), nor the augmentation's resampling, nor the loss (elementwise).

torch's counter has no formula for the CPU's fused attention kernel
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward), so on the CPU attention
would count 0; :data:`CPU_ATTENTION_FLOPS` gives it torch's own SDPA formulas, so a CPU and a
CUDA count of the same update agree. Pass it as ``custom_mapping`` to reproduce the count
(:func:`flop_counter`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from .config import Config
from .objectives import masked_mse, reconstruction_mse
from .patches import patchify
from .precision import autocast

_aten = torch.ops.aten


def _cpu_sdpa(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


CPU_ATTENTION_FLOPS = {  # FlopCounterMode's custom_mapping: shapes in, FLOPs out
    _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward,
}


def flop_counter() -> FlopCounterMode:
    """The counter :func:`update_flops` uses: torch's, plus the CPU attention kernel."""
    return FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)


def trainable_parameters(model: nn.Module) -> int:
    """Parameters the optimiser updates (encoder and decoder of the pretraining model)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def representative_batch(config: Config, data, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(model input ``[B,M,q]``, visible ``[B,k]`` or None) of one update, as the loop makes it:
    the first B pretraining images (cycled), a visible set / corruption from a generator of
    their own (seeded by ``seed_masks``)."""
    store = data.pretraining
    index = np.arange(config.batch_size) % len(store)
    clean = patchify(store.floats(index), data.patch_size).to(device)
    generator = torch.Generator().manual_seed(config.masks_seed)
    draw = config.objective_spec.draw(clean, config, generator, generator)  # V_t, X̃: the objective's own draw
    return (clean if draw.inputs is None else draw.inputs), (None if draw.visible is None else draw.visible.to(device))


def update_flops(model: nn.Module, config: Config, data) -> int:
    """FLOPs of one training update (forward and backward, see the module's note) of ``model``."""
    device = next(model.parameters()).device
    inputs, visible = representative_batch(config, data, device)
    params = [p for p in model.parameters() if p.requires_grad]
    modes = [(m, m.training) for m in model.modules()]
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            model.train()
            with flop_counter() as counter:
                with autocast(config.precision, device):
                    pred = model(inputs, visible) if visible is not None else model(inputs)
                # the loss and the target are elementwise (counted 0): a stand-in of the prediction's shape
                target = torch.zeros_like(pred, dtype=torch.float32)
                loss = (masked_mse(pred.float(), target, visible) if visible is not None
                        else reconstruction_mse(pred.float(), target)).mean()
                torch.autograd.grad(loss, params, allow_unused=True)
    finally:
        for module, training in modes:
            module.training = training
    return int(counter.get_total_flops())


def compute_metrics(model: nn.Module, config: Config, data, *, pretrain_seconds: float, updates: int,
                    eval_seconds: float) -> dict[str, float]:
    """The trial's compute metrics (:data:`evaluation.metrics.COMPUTE_METRICS`):
    ``model_parameters``, ``flops_per_update``, ``pretrain_seconds`` (wall time of this attempt's
    ``train`` call: model build, data to the device and compilation included; the same number as
    ``train_seconds``), ``updates_per_second`` (``updates`` this attempt ran / that time; absent
    when it ran none) and ``eval_seconds`` (wall time of the in-trial evaluation)."""
    metrics = {"model_parameters": float(trainable_parameters(model)),
               "flops_per_update": float(update_flops(model, config, data)),
               "pretrain_seconds": float(pretrain_seconds), "eval_seconds": float(eval_seconds)}
    if updates > 0 and pretrain_seconds > 0:
        metrics["updates_per_second"] = updates / pretrain_seconds
    return metrics
