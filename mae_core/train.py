"""The specification's training procedure, step for step.

For ``t = 0, ..., J-1`` (spec, "perform the following steps"):

1. sample ``I_t`` uniformly from the training set (with replacement across steps) and,
   independently, ``V_t ~ Uniform(V_k)``; a minibatch of size B draws B such pairs
   (``batch_size=1`` is the literal procedure);
2. encode the visible values, restore the order with the shared mask token, decode all M slots;
3. ``L_t = ((M-k)q)⁻¹ Σ_{j∉V_t} ||x̂_{t,j} - T(x_j)||²``, ``g_t = ∇L_t``,
   ``(θ_{t+1}, s_{t+1}) = U_t((θ_t, s_t), g_t)``.

The spec requires a finite gradient at every iterate: a non-finite loss or gradient stops the
run with :class:`NonFiniteError` naming the step. The AE and DAE objectives use the same loop
with the full-image loss (``R_rec``; ``R_den`` with a fresh corruption each step, Vincent et
al. eq. 5). Checkpoints hold model, optimiser, sampler RNG and step, are written atomically,
and resuming from one reproduces the uninterrupted run exactly on the CPU.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import Config
from .corruptions import corrupt
from .augment import augment
from .data import count_split_duplicates, load_dataset
from .images import DeviceImages, ImageStore
from .masking import sample_visible
from .models import build_model
from .objectives import masked_mse, reconstruction_mse
from .patches import patchify
from .precision import autocast, grad_scaler
from .targets import NormDomainReport, norm_domain_report, raise_outside_norm_domain, target_moments


class NonFiniteError(FloatingPointError):
    """The loss or its gradient left the reals at update ``step`` (0-based t of the spec)."""

    def __init__(self, step: int, what: str, lr: float):
        self.step, self.what = step, what
        super().__init__(f"non-finite {what} at step t={step} (lr={lr:.3g}); the spec requires a finite gradient at every iterate")


class TrainingInterrupted(KeyboardInterrupt):
    """The caller asked the loop to stop (Ctrl-C, SIGTERM); it stopped after update ``step``,
    with a checkpoint of that step written when the run has a checkpoint path."""

    def __init__(self, step: int, checkpoint: Path | None):
        self.step, self.checkpoint = step, checkpoint
        super().__init__(f"interrupted after step {step}")


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be read (for example truncated by a crash mid-write)."""


# ------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class PatchData:
    """A dataset on the trial's patch grid. The images stay as stored (:class:`ImageStore`:
    uint8 where the data are bytes, on disk above the RAM ceiling); pretraining converts them a
    batch at a time, and ``train_patches``/``test_patches`` (float32 ``[N,M,q]``, what the
    evaluation reads) are made on first read and kept. ``pretrain_images`` are the images the
    training loop samples when they are not the labelled training split (STL-10's unlabelled
    set)."""

    train_images: ImageStore
    train_labels: torch.Tensor
    test_images: ImageStore
    test_labels: torch.Tensor
    image_shape: tuple[int, int, int]
    patch_size: int
    # test images byte-equal to a training image, among the images used (logged every trial)
    train_test_duplicates: int = 0
    pretrain_images: ImageStore | None = None

    @functools.cached_property  # a frozen dataclass still has the __dict__ this writes to
    def train_patches(self) -> torch.Tensor:
        """The labelled training split as float32 patches [N,M,q]."""
        return patchify(self.train_images.floats(), self.patch_size)

    @functools.cached_property
    def test_patches(self) -> torch.Tensor:
        """The test split as float32 patches [N,M,q]."""
        return patchify(self.test_images.floats(), self.patch_size)

    @property
    def pretraining(self) -> ImageStore:
        """The images ``I_t`` is drawn from."""
        return self.pretrain_images if self.pretrain_images is not None else self.train_images


def prepare_data(config: Config) -> PatchData:
    """Load and limit the dataset (images as stored, nothing converted yet); refuse
    ``target=norm`` outside ``D_norm`` (checked a chunk at a time)."""
    dataset = load_dataset(config.dataset, seed=config.seed, ram_mb=config.data_ram_mb)
    p = config.resolved_patch_size
    limit = slice(None, config.train_limit)
    train_images, test_images = dataset.train[limit], dataset.test[: config.test_limit]
    pretrain_images = dataset.unlabelled[limit] if dataset.unlabelled is not None else None
    also = [pretrain_images] if pretrain_images is not None else []
    duplicates = dataset.train_test_duplicates
    if duplicates and (config.train_limit is not None or config.test_limit is not None):
        duplicates = count_split_duplicates(train_images, test_images, also=also)  # among the images kept
    if config.target == "norm":
        for images, split in ((train_images, "training set"), (pretrain_images, "unlabelled set"),
                              (test_images, "test set")):
            if images is not None:
                require_norm_domain_chunks(images, p, what=f"the {split} of dataset={config.dataset}")
    return PatchData(
        train_images=train_images, train_labels=dataset.train_labels[: config.train_limit],
        test_images=test_images, test_labels=dataset.test_labels[: config.test_limit],
        image_shape=dataset.image_shape, patch_size=p, train_test_duplicates=duplicates,
        pretrain_images=pretrain_images,
    )


def require_norm_domain_chunks(images: ImageStore, patch_size: int, what: str) -> None:
    """:func:`~mae_core.targets.require_norm_domain` over a store read a chunk at a time (the
    image named in the error counts from the start of the store)."""
    reports = [(offset, norm_domain_report(patchify(torch.from_numpy(images.to_float(stored)), patch_size)))
               for offset, stored in images.chunks()]
    bad = [(offset, report) for offset, report in reports if not report.ok]
    if bad:
        offset, first = bad[0]
        image, patch = first.first_bad
        raise_outside_norm_domain(NormDomainReport(
            num_images=len(images), num_bad_images=sum(r.num_bad_images for _, r in reports),
            num_bad_patches=sum(r.num_bad_patches for _, r in reports), first_bad=(offset + image, patch)), what)


# ------------------------------------------------------------------- schedule, optimiser


def learning_rate(step: int, *, peak: float, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """η_t: linear warm-up to ``peak`` over ``warmup_steps``, then cosine to 0 or constant."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if schedule == "constant":
        return peak
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, config: Config) -> torch.optim.Optimizer:
    """U_t as a named preset: AdamW as He et al. A.1 (β=0.9/0.95, decay 0.05 except norms,
    biases, tokens and positions) or plain SGD ``θ - η_t g``."""
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
    return torch.optim.AdamW(groups, lr=config.actual_lr, betas=(0.9, 0.95), fused=True)


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda but no CUDA device is available; use device=auto or cpu")
    return torch.device(choice)


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically: a temporary file in the same folder, fsync, then rename. The previous
    checkpoint is kept as ``<name>.prev`` so a damaged newest file still leaves a good one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    if path.exists():
        os.replace(path, path.with_name(path.name + ".prev"))
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load with ``weights_only=True``; raise :class:`CheckpointError` if the file is damaged."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated zip raises several different types
        raise CheckpointError(f"checkpoint {path} cannot be read: {error}") from error


def load_latest_checkpoint(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The newest readable checkpoint at ``path`` (or its ``.prev``), with warnings about any
    damaged file that was skipped."""
    warnings: list[str] = []
    for candidate in (Path(path), Path(path).with_name(Path(path).name + ".prev")):
        if not candidate.exists():
            continue
        try:
            return load_checkpoint(candidate), warnings
        except CheckpointError as error:
            warnings.append(str(error))
    return None, warnings


# ---------------------------------------------------------------------------------- loop


@dataclass
class TrainResult:
    model: nn.Module
    steps: int  # J actually completed
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, mean train_loss)
    resumed_from: int | None = None
    warnings: list[str] = field(default_factory=list)


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
    checkpoint_extra: dict[str, Any] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Run the J updates of the spec's procedure; resume from ``checkpoint_path`` if it exists.

    ``should_stop()`` is asked after every update; when it says yes the loop checkpoints that
    step (so nothing is lost) and raises :class:`TrainingInterrupted`.
    """
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    model = build_model(config).to(device)
    optimizer = build_optimizer(model, config)
    scaler = grad_scaler(config.precision, device)  # a no-op unless precision=fp16
    sampler = torch.Generator().manual_seed(config.seed + 1)  # draws I_t, V_t and corruptions
    history: list[tuple[int, float]] = []
    start, resumed_from, warnings = 0, None, []
    running_sum, since_log = 0.0, 0  # train_loss accumulated since the last record
    if checkpoint_path is not None:
        state, warnings = load_latest_checkpoint(checkpoint_path)
        if state is not None:
            changed = changed_keys(config, state["config"])
            if changed:
                raise CheckpointError(f"checkpoint {checkpoint_path} was written with different "
                                      f"values of {', '.join(changed)}; resume with the same config")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            sampler.set_state(state["sampler"])
            if "scaler" in state:
                scaler.load_state_dict(state["scaler"])
            start = resumed_from = int(state["step"])
            history = [(int(s), float(v)) for s, v in state["history"]]
            # a checkpoint between two records carries the partial sum, so the resumed history
            # equals the uninterrupted one even when checkpoint_every is no multiple of log_every
            running_sum, since_log = float(state.get("running_sum", 0.0)), int(state.get("since_log", 0))

    # The pretraining images as stored (uint8: a quarter of float32) live on the device when
    # they are in memory; a batch is gathered and converted there, and only the B indices and
    # visible sets cross each step. Images on disk are read batch by batch instead.
    if config.target == "norm":  # every image once, as apply_target on the whole set did
        require_norm_domain_chunks(data.pretraining, data.patch_size, what="the training set")
    images = DeviceImages(data.pretraining, device)
    value_range = (0.0, 1.0) if data.pretraining.table is not None else None  # bytes: pixels in [0, 1]
    n, num_patches, k = len(images), config.num_patches, config.num_visible
    step_fn = torch.compile(model) if config.compile_enabled else model
    forward_precision = autocast(config.precision, device)  # the loss below is always fp32
    peak = config.actual_lr
    running = torch.tensor(running_sum, dtype=torch.float64, device=device)
    watch = DivergenceWatch(device)

    def lr_at(t: int) -> float:
        return learning_rate(t, peak=peak, warmup_steps=config.warmup_steps,
                             total_steps=config.steps, schedule=config.schedule)

    model.train()
    for t in range(start, config.steps):
        lr = lr_at(t)
        for group in optimizer.param_groups:
            group["lr"] = lr
        index = torch.randint(n, (config.batch_size,), generator=sampler)  # I_t, drawn on the CPU
        # the augmentation (none by default: it draws nothing then) draws from the same sampler
        clean = patchify(augment(images(index), config.augment, sampler, value_range), data.patch_size)  # [B,M,q]
        target = batch_target(clean, config.target)
        if config.objective == "mae":
            visible = sample_visible(config.batch_size, num_patches, k, sampler,
                                     config.mask_sampling, config.grid)  # V_t
            visible = visible.to(device, non_blocking=True)
            with forward_precision:
                pred = step_fn(clean, visible)
            loss = masked_mse(pred.float(), target, visible).mean()
        else:
            x = clean
            if config.objective == "dae":  # the corruption draws from the same CPU sampler
                x = corrupt(clean.cpu(), config.resolved_corruption, config.corruption_level,
                            sampler).to(device, non_blocking=True)
            with forward_precision:
                pred = step_fn(x)
            loss = reconstruction_mse(pred.float(), target).mean()
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # the true gradient, for the watch (identity unless fp16)
        # Under fp16 an overflowing gradient is the scaler's business (it skips that update and
        # lowers the scale); only a non-finite loss means the run itself diverged.
        watch.observe(t, loss, model, check_gradients=not scaler.is_enabled())
        scaler.step(optimizer)
        scaler.update()

        running += loss.detach().double()
        since_log += 1
        done = t + 1
        log_due = is_due(done, config.log_every, config.steps)
        checkpoint_due = checkpoint_path is not None and is_due(done, config.checkpoint_every, config.steps)
        if log_due or checkpoint_due:
            watch.check(lr_at)  # the one host sync: nothing non-finite is recorded or saved
        if log_due:
            history.append((done, float(running / since_log)))
            if on_log is not None:
                on_log(done, {"train_loss": history[-1][1]})
            running.zero_()
            since_log = 0
        stop = should_stop is not None and should_stop()
        if stop and checkpoint_path is not None and not checkpoint_due:
            watch.check(lr_at)
            checkpoint_due = True
        if checkpoint_due:
            save_checkpoint(checkpoint_path, {
                "step": done, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "sampler": sampler.get_state(), "history": history,
                "running_sum": float(running), "since_log": since_log,
                "config": config.resolved(), "extra": checkpoint_extra or {},
                "scaler": scaler.state_dict(),
            })
            if on_checkpoint is not None and not stop:
                on_checkpoint(done, checkpoint_path)
        if stop:
            raise TrainingInterrupted(done, checkpoint_path)
    model.eval()
    return TrainResult(model=model, steps=config.steps, history=history,
                       resumed_from=resumed_from, warnings=warnings)


def batch_target(patches: torch.Tensor, kind: str) -> torch.Tensor:
    """``T(x_j)`` of a batch [B,M,q], the arithmetic of :func:`apply_target` without its
    ``D_norm`` check: :func:`prepare_data` checked every training image once, and a check per
    step would wait for the GPU every step."""
    if kind == "raw":
        return patches
    mean, scale = target_moments(patches, kind)
    return (patches - mean) / scale


def changed_keys(config: Config, saved: dict[str, Any]) -> list[str]:
    """Keys whose value differs from a checkpoint's config. A key the checkpoint predates
    (added to Config later) counts as unchanged while it keeps its default."""
    defaults = {name: field.default for name, field in Config.model_fields.items()}
    return sorted(k for k, v in config.resolved().items()
                  if saved.get(k, defaults.get(k, v)) != v)


class DivergenceWatch:
    """Remembers the first update whose loss or gradient is non-finite, on the device.

    :meth:`observe` adds no host synchronisation (it matters on a GPU); :meth:`check` makes
    one and raises :class:`NonFiniteError` naming that first step, which the loop calls before
    anything is recorded or saved, so no checkpoint or logged loss ever holds a non-finite value.
    """

    def __init__(self, device: torch.device):
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.loss_was_bad = torch.zeros((), dtype=torch.bool, device=device)

    def observe(self, step: int, loss: torch.Tensor, model: nn.Module, check_gradients: bool = True) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None] if check_gradients else []
        loss_ok = torch.isfinite(loss.detach())
        grads_ok = (torch.isfinite(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
                    if grads else torch.ones_like(loss_ok))
        first = (self.first_bad < 0) & ~(loss_ok & grads_ok)
        self.first_bad = torch.where(first, step, self.first_bad)
        self.loss_was_bad = torch.where(first, ~loss_ok, self.loss_was_bad)

    def check(self, lr_at: Callable[[int], float]) -> None:
        step = int(self.first_bad)
        if step >= 0:
            raise NonFiniteError(step, "loss" if bool(self.loss_was_bad) else "gradient", lr_at(step))
