"""The specification's training procedure, step for step.

For ``t = 0, ..., J-1`` (spec, "perform the following steps"):

1. sample ``I_t`` uniformly from the training set (with replacement across steps) and,
   independently, ``V_t ~ Uniform(V_k)``; a minibatch of size B draws B such pairs
   (``batch_size=1`` is the literal procedure);
2. encode the visible values, restore the order with the shared mask token, decode all M slots;
3. ``L_t = ((M-k)q)⁻¹ Σ_{j∉V_t} ||x̂_{t,j} - T(x_j)||²``, ``g_t = ∇L_t``,
   ``(θ_{t+1}, s_{t+1}) = U_t((θ_t, s_t), g_t)``.

The spec requires a finite gradient at every iterate: a non-finite loss or gradient stops the
run with :class:`~mae_core.updates.NonFiniteError` naming the step. The AE and DAE objectives use
the same loop with the full-image loss (``R_rec``; ``R_den`` with a fresh corruption each step,
Vincent et al. eq. 5). This module is the loop alone; its parts live beside it: one update, eager
or capturable as one CUDA graph (:mod:`mae_core.updates`), the schedule and optimiser
(:mod:`mae_core.optimizer`), checkpoints written atomically and resumed bitwise on the CPU
(:mod:`mae_core.checkpoint`), and the trial's data (:func:`mae_core.data.prepare_data`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from warnings import warn

import torch
from torch import nn

from .checkpoint import restore_loop, save_checkpoint
from .config import Config
from .data import PatchData, require_target_domain
from .devices import resolve_device
from .distributed import Shard, wrap_model
from .images import DeviceImages
from .models import build_model
from .optimizer import build_optimizer, learning_rate, optimizer_state
from .precision import autocast, grad_scaler
from .updates import (CapturableUpdate, CudaGraphWarning, DivergenceWatch, EagerUpdate, UpdateParts, UpdatePlan,
                      noise_generator, update_plan)


class TrainingInterrupted(KeyboardInterrupt):
    """The caller asked the loop to stop (Ctrl-C, SIGTERM); it stopped after update ``step``,
    with a checkpoint of that step written when the run has a checkpoint path."""

    def __init__(self, step: int, checkpoint: Path | None):
        self.step, self.checkpoint = step, checkpoint
        super().__init__(f"interrupted after step {step}")



@dataclass
class TrainResult:
    model: nn.Module
    steps: int  # J actually completed
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, mean train_loss)
    resumed_from: int | None = None
    warnings: list[str] = field(default_factory=list)
    update_mode: str = "eager"  # eager | capturable (uncaptured) | cuda_graph: how the updates ran


def is_due(step: int, every: int, total: int) -> bool:
    """True after update ``step`` (1-based count) when a periodic action is due, and at the end."""
    return step == total or (every > 0 and step % every == 0)



def train(
    config: Config,
    data: PatchData,
    *,
    checkpoint_path: Path | None = None,
    on_log: Callable[[int, dict[str, float]], None] | None = None,
    on_checkpoint: Callable[[int, Path], None] | None = None,
    on_evaluate: Callable[[int, nn.Module], None] | None = None,
    snapshot_steps: Collection[int] = (),
    on_snapshot: Callable[[int, nn.Module, list[tuple[int, float]]], None] | None = None,
    checkpoint_extra: dict[str, Any] | None = None,
    should_stop: Callable[[], bool] | None = None,
    shard: Shard = Shard(),
    after_update: Callable[[int], None] | None = None,
) -> TrainResult:
    """Run the J updates of the spec's procedure; resume from ``checkpoint_path`` if it exists.

    ``should_stop()`` is asked after every update; when it says yes the loop checkpoints that
    step (so nothing is lost) and raises :class:`TrainingInterrupted`. ``after_update(step)`` is
    called last after every update (the interrupt tests hold a run there: :mod:`studies.testing_hooks`).

    ``on_evaluate(step, model)`` is called after update ``step`` when an online evaluation is due
    (``eval.every``: every N updates and after the last), once the loss and gradients so far are
    checked finite and before that step's checkpoint is written (a crash in between repeats it on
    resume). The loop only says when; the callback measures without changing the trajectory
    (:mod:`evaluation.online`).

    ``on_snapshot(step, model, history)`` is called after each update in ``snapshot_steps``, at
    the same point, with the ``train_loss`` history so far: the model a shorter run of the same
    learning-rate sequence ends with (:mod:`studies.pretrained` keeps it for such a run).

    ``shard``: this process's rank in a data-parallel run (:mod:`mae_core.distributed`, with
    the process group already initialised): each rank computes its slice of every global batch,
    DDP averages the gradients, the recorded loss is the global batch's, a stop asked on one rank
    stops all, and only rank 0 writes checkpoints (the callbacks run on every rank). The update
    is eager or capturable, never one CUDA graph (the gradient all-reduce is not captured).
    """
    device = torch.device(shard.device) if shard.device is not None else resolve_device(config.device)
    plan = update_plan(config, device, images_in_memory=data.pretraining.in_memory)
    if shard.active and plan.graph:
        plan = UpdatePlan(capturable=True, graph=False, note=(
            f"cuda_graph={str(config.cuda_graph).lower()}: a run on {shard.world_size} workers "
            "all-reduces its gradients outside a graph; the update stays capturable, uncaptured"))
    if plan.note is not None:
        warn(plan.note, CudaGraphWarning, stacklevel=2)
    torch.manual_seed(config.init_seed)  # seed_init: the weights (and any later draw of the global generator)
    model = build_model(config).to(device)
    optimizer = build_optimizer(model, config, capturable=plan.capturable)
    scaler = grad_scaler(config.precision, device)  # a no-op unless precision=fp16
    sampler = torch.Generator().manual_seed(config.masks_seed + 1)  # seed_masks: draws I_t, V_t, crops (and X̃ on the CPU)
    noise = noise_generator(config, device, sampler)
    loop, warnings = restore_loop(checkpoint_path, config, model, optimizer, sampler, scaler, noise)
    history, since_log = loop.history, loop.since_log

    # The pretraining images as stored (uint8: a quarter of float32) live on the device when
    # they are in memory; a batch is gathered and converted there, and only the B indices and
    # visible sets cross each step. Images on disk are read batch by batch instead.
    # every image once, as apply_target on the whole set did
    require_target_domain(data.pretraining, data.patch_size, config.target, what="the training set")
    peak = config.actual_lr

    def lr_at(t: int) -> float:
        return learning_rate(t, peak=peak, warmup_steps=config.warmup_updates,
                             total_steps=config.steps, schedule=config.schedule)

    parts = UpdateParts(
        config=config, model=model, forward=(torch.compile(wrap_model(model, shard, device))
                                             if config.compile_enabled_on(device.type, graph=plan.graph)
                                             else wrap_model(model, shard, device)),
        optimizer=optimizer, scaler=scaler, images=DeviceImages(data.pretraining, device),
        patch_size=data.patch_size, sampler=sampler,
        # the loss is always fp32; a captured forward pass needs autocast without its weight cache
        autocast=autocast(config.precision, device, cache_enabled=not plan.capturable),
        running=torch.tensor(loop.running_sum, dtype=torch.float64, device=device),
        watch=DivergenceWatch(device), lr_at=lr_at, shard=shard, noise=noise)
    update = (CapturableUpdate(parts, start=loop.step, graph=plan.graph) if plan.capturable
              else EagerUpdate(parts, value_range=(0.0, 1.0) if data.pretraining.table is not None else None))
    running, watch = parts.running, parts.watch

    model.train()
    try:
        for t in range(loop.step, config.steps):
            update(t)
            since_log += 1
            done = t + 1
            log_due = is_due(done, config.log_every, config.steps)
            evaluate_due = on_evaluate is not None and config.eval.every > 0 and is_due(
                done, config.eval.every, config.steps)
            checkpoint_due = checkpoint_path is not None and is_due(done, config.checkpoint_every, config.steps)
            if log_due or checkpoint_due or evaluate_due:
                watch.check(lr_at)  # the one host sync: nothing non-finite is recorded or saved
            if log_due:
                history.append((done, float(running / since_log)))
                if on_log is not None:
                    on_log(done, {"train_loss": history[-1][1]})
                running.zero_()
                since_log = 0
            if evaluate_due:
                on_evaluate(done, model)
            if on_snapshot is not None and done in snapshot_steps:
                watch.check(lr_at)  # nothing non-finite is kept for another run
                on_snapshot(done, model, list(history))
            stop = should_stop is not None and shard.any(should_stop(), device)
            if stop and checkpoint_path is not None and not checkpoint_due:
                watch.check(lr_at)
                checkpoint_due = True
            if checkpoint_due and shard.rank == 0:
                save_checkpoint(checkpoint_path, {
                    "step": done, "model": model.state_dict(), "optimizer": optimizer_state(optimizer),
                    "sampler": update.sampler_state(done), "history": history,
                    "running_sum": float(running), "since_log": since_log,
                    "config": config.resolved(), "extra": checkpoint_extra or {},
                    "scaler": scaler.state_dict(),
                    **({"noise": noise.get_state()} if noise is not sampler else {}),
                })
            if checkpoint_due:
                shard.barrier()  # the file every rank resumes from is written
                if on_checkpoint is not None and not stop:
                    on_checkpoint(done, checkpoint_path)
            if stop:
                raise TrainingInterrupted(done, checkpoint_path)
            if after_update is not None:
                after_update(done)
    finally:
        parts.images.close()  # the prefetching thread (images on disk), on every way out
    model.eval()
    return TrainResult(model=model, steps=config.steps, history=history,
                       resumed_from=loop.step if loop.resumed else None, warnings=warnings,
                       update_mode=update.mode)
