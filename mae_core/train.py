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
al. eq. 5). Checkpoints hold model, optimiser, sampler RNG (and the DAE's noise generator, see
:func:`noise_generator`) and step, are written atomically, and resuming from one reproduces the
uninterrupted run exactly on the CPU.

``capturable`` runs the same updates with nothing read from the host (step size and step count
on the device, I_t and V_t drawn ahead in the same order), so that on CUDA ``cuda_graph`` can
capture one whole update and replay it (:class:`CapturableUpdate`); on the CPU it gives the eager
loop's numbers.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from warnings import warn

import torch
from torch import nn

from . import registry
from .config import SEED_SOURCES, Config
from .corruptions import corrupt
from .augment import augment
from .data import count_split_duplicates, load_dataset
from .distributed import Shard, wrap_model
from .images import DeviceImages, ImageStore
from .labels import require_two_classes
from .masking import sample_visible
from .models import build_model
from .objectives import masked_mse, reconstruction_mse
from .patches import patchify
from .plugin_checks import target_result
from .precision import autocast, grad_scaler, resolve_precision


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
    dataset = load_dataset(config.dataset, seed=config.data_seed, ram_mb=config.data_ram_mb)
    p = config.resolved_patch_size
    limit = slice(None, config.train_limit)
    train_images, test_images = dataset.train[limit], dataset.test[: config.test_limit]
    pretrain_images = dataset.unlabelled[limit] if dataset.unlabelled is not None else None
    also = [pretrain_images] if pretrain_images is not None else []
    duplicates = dataset.train_test_duplicates
    if duplicates and (config.train_limit is not None or config.test_limit is not None):
        duplicates = count_split_duplicates(train_images, test_images, also=also)  # among the images kept
    if "probes" in config.eval.evaluators:  # one class: a perfect, meaningless probe accuracy
        cut = config.train_limit is not None and config.train_limit < len(dataset.train_labels)
        kept = f" (its first {config.train_limit} images, train_limit)" if cut else ""
        require_two_classes(dataset.train_labels[limit], f"the training split{kept} of dataset={config.dataset}")
    for images, split in ((train_images, "training set"), (pretrain_images, "unlabelled set"),
                          (test_images, "test set")):
        if images is not None:
            require_target_domain(images, p, config.target, what=f"the {split} of dataset={config.dataset}")
    return PatchData(
        train_images=train_images, train_labels=dataset.train_labels[: config.train_limit],
        test_images=test_images, test_labels=dataset.test_labels[: config.test_limit],
        image_shape=dataset.image_shape, patch_size=p, train_test_duplicates=duplicates,
        pretrain_images=pretrain_images,
    )


def require_target_domain(images: ImageStore, patch_size: int, kind: str, what: str) -> None:
    """The target's domain check (``norm``: every patch in ``D_norm``) over a store, read a
    chunk at a time; a target without one accepts any images."""
    check = registry.targets.get(kind).domain_check
    if check is not None:
        check((patchify(torch.from_numpy(images.to_float(stored)), patch_size) for _, stored in images.chunks()), what)


# ------------------------------------------------------------------- schedule, optimiser


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


CHECKPOINT_KEYS = ("step", "model", "config")  # what every checkpoint save_checkpoint writes holds


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load with ``weights_only=True``; raise :class:`CheckpointError` (one line naming the file)
    if the file is damaged or is not a checkpoint this trainer wrote."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated zip raises several different types
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"checkpoint {path} cannot be read: {reason}") from error
    if not isinstance(state, dict) or any(key not in state for key in CHECKPOINT_KEYS):
        raise CheckpointError(f"checkpoint {path} cannot be read: not a checkpoint mae-study wrote "
                              f"(a mapping with {', '.join(CHECKPOINT_KEYS)})")
    return state


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
    update_mode: str = "eager"  # eager | capturable (uncaptured) | cuda_graph: how the updates ran


def is_due(step: int, every: int, total: int) -> bool:
    """True after update ``step`` (1-based count) when a periodic action is due, and at the end."""
    return step == total or (every > 0 and step % every == 0)


@dataclass
class LoopState:
    """Where the loop starts: step 0 with nothing recorded, or where a checkpoint left it. The
    loss summed since the last record travels too, so a resumed history equals the uninterrupted
    one even when checkpoint_every is no multiple of log_every."""
    step: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, mean train_loss)
    running_sum: float = 0.0
    since_log: int = 0
    resumed: bool = False


def noise_generator(config: Config, device: torch.device, sampler: torch.Generator) -> torch.Generator:
    """Where the DAE's corruption X̃ is drawn: on the CPU from the run's sampler (after I_t, as
    before issue 26: every CPU number unchanged), on any other device from a generator of its own
    there, seeded ``seed_masks + 2`` (the sampler is ``seed_masks + 1``), so the noise is drawn beside
    the images with no host sync. That generator's state is checkpointed (``noise``), so a resumed
    run draws the noise the uninterrupted one would have. The spec allows either: a stochastic
    denoising corruption is any random image on the same probability space as X, its dependence
    arbitrary (spec, population denoising risk; Vincent et al. eq. 5 samples it per update)."""
    if not config.objective_spec.corrupted or device.type == "cpu":
        return sampler
    return torch.Generator(device).manual_seed(config.masks_seed + 2)


def restore_loop(checkpoint_path: Path | None, config: Config, model: nn.Module,
                 optimizer: torch.optim.Optimizer, sampler: torch.Generator,
                 scaler, noise: torch.Generator | None = None) -> tuple[LoopState, list[str]]:
    """Load the newest readable checkpoint under ``checkpoint_path`` into the model, optimizer,
    sampler, scaler and the DAE's ``noise`` generator (when it is not the sampler), and say where
    the loop resumes (a fresh LoopState when there is none). Refuses, with CheckpointError, a
    checkpoint written with another config. A checkpoint without the noise generator's state
    (written on the CPU, or before issue 26) resumes with that generator seeded afresh from the
    step, said in the warnings: the run goes on, but not bitwise as an uninterrupted one."""
    state, warnings = load_latest_checkpoint(checkpoint_path) if checkpoint_path else (None, [])
    if state is None:
        return LoopState(), warnings
    changed = changed_keys(config, state["config"])
    if changed:
        raise CheckpointError(f"checkpoint {checkpoint_path} was written with different "
                              f"values of {', '.join(changed)}; resume with the same config")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.set_state(state["sampler"])
    if noise is not None and noise is not sampler:
        if "noise" in state:
            noise.set_state(state["noise"])
        else:
            noise.manual_seed(config.masks_seed + 2 + int(state["step"]))
            warnings = [*warnings, f"checkpoint {checkpoint_path} holds no state of the DAE's noise generator "
                        f"on {noise.device.type} (written on the CPU or before issue 26): its noise after step "
                        f"{int(state['step'])} is drawn afresh, so this run is not bitwise an uninterrupted one"]
    if "scaler" in state:
        scaler.load_state_dict(state["scaler"])
    return LoopState(step=int(state["step"]),
                     history=[(int(s), float(v)) for s, v in state["history"]],
                     running_sum=float(state.get("running_sum", 0.0)),
                     since_log=int(state.get("since_log", 0)), resumed=True), warnings


# ------------------------------------------------------------------------------ one update


class CudaGraphWarning(UserWarning):
    """A requested CUDA graph is not used for this run; the message says why."""


@dataclass(frozen=True)
class UpdatePlan:
    """How the loop runs each update: ``capturable`` (device step size and step count,
    capturable AdamW, I_t and V_t drawn ahead into fixed buffers) and ``graph`` (one CUDA graph
    per update); ``note`` says once why a requested graph is not used."""

    capturable: bool
    graph: bool
    note: str | None = None


def graph_blocker(config: Config, device: torch.device, images_in_memory: bool = True) -> str | None:
    """Why one update of this run cannot be captured as a CUDA graph, or None when it can.
    Each reason names the key (and, where it is one, what in the update needs the host); the
    variants captured are the ones issue 26 asks for: objective mae | ae, mask_sampling random |
    grid, precision fp32 | bf16, with AdamW, no augmentation and the images in memory."""
    if config.objective_spec.corrupted:
        return f"objective={config.objective} draws its corruption per update, not ahead into fixed buffers"
    if config.mask_sampling == "block":
        return "mask_sampling=block is not captured (random and grid are)"
    if resolve_precision(config.precision, device) == "fp16":
        return "precision=fp16: the gradient scaler's update is not captured (fp32 and bf16 are)"
    if config.optimizer != "adamw":
        return f"optimizer={config.optimizer}: torch's foreach SGD reads a tensor step size on the host"
    if config.augment != "none":
        return f"augment={config.augment} draws its crops on the host per update"
    if not images_in_memory:
        return "the training images are read from disk batch by batch"
    if device.type != "cuda":
        return f"no CUDA device (device={device.type})"
    return None


def update_plan(config: Config, device: torch.device, images_in_memory: bool = True) -> UpdatePlan:
    """``cuda_graph`` and ``capturable`` resolved for this run: ``auto`` and ``true`` capture
    where :func:`graph_blocker` finds nothing (a captured update is always capturable); otherwise
    the update runs uncaptured, capturable as ``capturable`` says, with a note when a graph was
    asked for (``true``, or ``auto`` on CUDA)."""
    blocker = graph_blocker(config, device, images_in_memory) if config.cuda_graph is not False else None
    graph = config.cuda_graph is not False and blocker is None
    asked = config.cuda_graph is True or (config.cuda_graph == "auto" and device.type == "cuda")
    note = None
    if blocker is not None and asked:
        how = "capturable, uncaptured" if config.capturable else "eager"
        note = f"cuda_graph={str(config.cuda_graph).lower()}: {blocker}; the update stays {how}"
    return UpdatePlan(capturable=config.capturable or graph, graph=graph, note=note)


@dataclass
class UpdateParts:
    """What an update reads and writes: the model (``forward`` is it or its compiled form), the
    optimiser and scaler, the device images, the sampler of I_t, V_t (and crops), the generator of
    the DAE's corruption (:func:`noise_generator`: the sampler on the CPU), the forward pass's
    autocast, the loss summed since the last record and the divergence watch."""

    config: Config
    model: nn.Module
    forward: Callable[..., torch.Tensor]
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    images: DeviceImages
    patch_size: int
    sampler: torch.Generator
    autocast: AbstractContextManager
    running: torch.Tensor  # float64 0-d, on the device
    watch: DivergenceWatch
    lr_at: Callable[[int], float]
    shard: Shard = Shard()  # this rank's slice of each global batch (mae_core.distributed)
    noise: torch.Generator | None = None  # the DAE's corruption; None: the sampler

    def loss(self, clean: torch.Tensor, visible: torch.Tensor | None, x: torch.Tensor | None = None) -> torch.Tensor:
        """``L_t``: the mean of ℓ_MAE at ``visible`` (MAE) or of the reconstruction error of the
        input ``x`` (AE: ``clean``; DAE: its corruption) against ``T(clean)``."""
        target = batch_target(clean, self.config.target)
        if visible is not None:
            with self.autocast:
                pred = self.forward(clean, visible)
            return masked_mse(pred.float(), target, visible).mean()
        with self.autocast:
            pred = self.forward(clean if x is None else x)
        return reconstruction_mse(pred.float(), target).mean()

    def step(self, step: int | torch.Tensor, loss: torch.Tensor) -> None:
        """``g_t = ∇L_t`` and ``U_t``; ``running += L_t``."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)  # the true gradient, for the watch (identity unless fp16)
        # Under fp16 an overflowing gradient is the scaler's business (it skips that update and
        # lowers the scale); only a non-finite loss means the run itself diverged.
        loss = self.shard.mean(loss.detach())  # L_t of the global batch: every rank watches and records it
        self.watch.observe(step, loss, self.model, check_gradients=not self.scaler.is_enabled())
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.running += loss.detach().double()


class EagerUpdate:
    """Update t as the spec's steps 1-3, drawing I_t and V_t (and the corruption) when it runs."""

    mode = "eager"

    def __init__(self, parts: UpdateParts, value_range: tuple[float, float] | None):
        self.parts, self.value_range = parts, value_range

    def __call__(self, t: int) -> None:
        p, config = self.parts, self.parts.config
        lr = p.lr_at(t)
        for group in p.optimizer.param_groups:
            group["lr"] = lr
        index = torch.randint(len(p.images), (config.batch_size,), generator=p.sampler)  # I_t, drawn on the CPU
        # Several ranks: every rank draws the global batch's I_t, V_t (and augmentation or
        # corruption) as one process would, then keeps its rows. Without augmentation or
        # corruption nothing is drawn per image, so a rank reads only its own images.
        rows = p.shard.rows(config.batch_size) if p.shard.active else slice(None)
        whole = config.augment != "none" or config.objective_spec.corrupted
        # the augmentation (none by default: it draws nothing then) draws from the same sampler
        clean = patchify(augment(p.images(index if whole else index[rows]), config.augment, p.sampler,
                                 self.value_range), p.patch_size)  # [B,M,q] (this rank's rows of it)
        visible = x = None
        if config.objective_spec.masked:
            visible = sample_visible(config.batch_size, config.num_patches, config.num_visible, p.sampler,
                                     config.mask_sampling, config.grid)[rows]  # V_t
            visible = visible.to(clean.device, non_blocking=True)
        elif config.objective_spec.corrupted:  # X̃ drawn beside the images (on the CPU: from the sampler)
            x = corrupt(clean, config.resolved_corruption, config.corruption_level,
                        p.sampler if p.noise is None else p.noise)[rows]
        if p.images.reader is not None and t + 1 < config.steps:  # images on disk: read I_{t+1} meanwhile
            following = self.next_index(len(p.images), config.batch_size)
            p.images.prefetch(following if whole else following[rows])
        p.step(t, p.loss(clean[rows] if whole else clean, visible, x))

    def next_index(self, n: int, batch: int) -> torch.Tensor:
        """I_{t+1} as update t+1 will draw it (every draw of update t is made), from a copy of
        the sampler: the sampler itself is not advanced."""
        peek = torch.Generator().manual_seed(0)
        peek.set_state(self.parts.sampler.get_state())
        return torch.randint(n, (batch,), generator=peek)

    def sampler_state(self, done: int) -> torch.Tensor:
        """The sampler's state after update ``done - 1`` (the last one run)."""
        return self.parts.sampler.get_state()


GRAPH_WARMUP_UPDATES = 3  # uncaptured updates on a side stream before the capture (torch's CUDA-graph notes)
DRAW_AHEAD = 64  # updates whose I_t and V_t are drawn at a time


class CapturableUpdate:
    """Update t with nothing read from the host, so one CUDA graph can hold it whole.

    The step count t and the step size η_t live on the device (η_t indexed from a table of the
    schedule), the optimiser is capturable, and I_t, V_t of the next :data:`DRAW_AHEAD` updates are
    drawn ahead into fixed device buffers: from the same sampler, in the same order as
    :class:`EagerUpdate` draws them, so every draw and every number is the eager loop's (the
    sampler's state after each update is kept for the checkpoints). With ``graph`` (CUDA only)
    the first :data:`GRAPH_WARMUP_UPDATES` updates run uncaptured on a side stream, the next is
    captured, and every update from then on is one replay; otherwise each update runs uncaptured.
    """

    def __init__(self, parts: UpdateParts, *, start: int, graph: bool):
        config, device = parts.config, parts.running.device
        self.parts, self.device = parts, device
        # The fused CUDA kernel reads a float32 step size; on the CPU a float64 one gives the eager
        # loop's updates bitwise (measured on torch 2.13), a float32 one differs in the last bits.
        dtype = torch.float64 if device.type == "cpu" else torch.float32
        self.lr_table = torch.tensor([parts.lr_at(t) for t in range(config.steps)], dtype=dtype, device=device)
        self.lr = torch.zeros((), dtype=dtype, device=device)
        self.step = torch.tensor(start, dtype=torch.long, device=device)  # t
        make_capturable(parts.optimizer, self.lr)
        batch, k = config.batch_size, config.num_visible
        self.index = torch.zeros(DRAW_AHEAD, batch, dtype=torch.long, device=device)  # I_t of the drawn updates
        self.visible = (torch.zeros(DRAW_AHEAD, batch, k, dtype=torch.long, device=device)
                        if config.objective_spec.masked else None)  # V_t
        self.slot = torch.zeros((), dtype=torch.long, device=device)  # t - first drawn update
        self.host_index: torch.Tensor | None = None  # [updates, B] on the CPU: images read from disk
        self.first = self.end = start  # the drawn updates are [first, end)
        self.states: list[torch.Tensor] = []  # the sampler's state before each drawn update, and after the last
        self.capture, self.warmed_up = graph, 0
        self.graph: torch.cuda.CUDAGraph | None = None

    @property
    def mode(self) -> str:
        """``cuda_graph`` once an update was captured, ``capturable`` while none is."""
        return "cuda_graph" if self.graph is not None else "capturable"

    def __call__(self, t: int) -> None:
        if t >= self.end:
            self._draw_ahead(t)
        if not self.capture:
            self._update(t)
        elif self.warmed_up < GRAPH_WARMUP_UPDATES:
            self._warm_up(t)
        else:
            if self.graph is None:
                self._capture(t)
            if self.graph is not None:
                self.graph.replay()

    def sampler_state(self, done: int) -> torch.Tensor:
        """The sampler's state after the draws of updates ``< done``: the eager loop's after update ``done - 1``."""
        return self.states[done - self.first]

    def _draw_ahead(self, t: int) -> None:
        config, sampler = self.parts.config, self.parts.sampler
        count = min(DRAW_AHEAD, config.steps - t)
        states, index, visible = [], [], []
        for _ in range(count):
            states.append(sampler.get_state())
            index.append(torch.randint(len(self.parts.images), (config.batch_size,), generator=sampler))
            if self.visible is not None:
                visible.append(sample_visible(config.batch_size, config.num_patches, config.num_visible, sampler,
                                              config.mask_sampling, config.grid))
        states.append(sampler.get_state())
        self.states, self.first, self.end = states, t, t + count
        self.host_index = torch.stack(index)
        # stream-ordered after every update already queued, which may still read the old draws
        self.index[:count].copy_(self.host_index, non_blocking=True)
        if self.visible is not None:
            self.visible[:count].copy_(torch.stack(visible), non_blocking=True)
        self.slot.zero_()

    def _update(self, t: int | None) -> None:
        """One update read from the buffers; ``t`` (None under capture) picks the host copy of
        I_t when the images are read from disk (never captured)."""
        p = self.parts
        self.lr.copy_(self.lr_table.index_select(0, self.step.view(1)).view(()))
        slot = self.slot.view(1)
        if p.images.values is None:
            index = self.host_index[t - self.first]
        else:
            index = self.index.index_select(0, slot).view(-1)
        rows = p.shard.rows(p.config.batch_size) if p.shard.active else slice(None)  # this rank's images
        clean = patchify(p.images(index[rows]), p.patch_size)  # [B,M,q]
        if p.images.reader is not None and t is not None and t + 1 < self.end:  # on disk: read I_{t+1} meanwhile
            p.images.prefetch(self.host_index[t + 1 - self.first][rows])
        visible = None if self.visible is None else self.visible.index_select(0, slot)[0][rows]  # [B,k]
        p.step(self.step, p.loss(clean, visible))
        self.step += 1
        self.slot += 1

    def _warm_up(self, t: int) -> None:
        side, main = torch.cuda.Stream(self.device), torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            self._update(t)
        main.wait_stream(side)
        self.warmed_up += 1

    def _capture(self, t: int) -> None:
        """Record update t as a graph (capture runs nothing; the caller replays it). Under
        ``cuda_graph=auto`` a failed capture leaves the run uncaptured, said once."""
        graph = torch.cuda.CUDAGraph()
        self.parts.optimizer.zero_grad(set_to_none=True)
        try:
            with torch.cuda.graph(graph):
                self._update(None)
        except Exception as error:
            if self.parts.config.cuda_graph is True:
                raise
            warn(f"cuda_graph=auto: capturing the update failed ({type(error).__name__}: {error}); "
                 "the update stays capturable, uncaptured", CudaGraphWarning, stacklevel=3)
            self.parts.optimizer.zero_grad(set_to_none=True)
            self.capture = False
            self._update(t)
            return
        self.graph = graph


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
) -> TrainResult:
    """Run the J updates of the spec's procedure; resume from ``checkpoint_path`` if it exists.

    ``should_stop()`` is asked after every update; when it says yes the loop checkpoints that
    step (so nothing is lost) and raises :class:`TrainingInterrupted`.

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

    pause_at = pause_step_for_tests()
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
            if done == pause_at:
                hold_for_tests(should_stop)
    finally:
        parts.images.close()  # the prefetching thread (images on disk), on every way out
    model.eval()
    return TrainResult(model=model, steps=config.steps, history=history,
                       resumed_from=loop.step if loop.resumed else None, warnings=warnings,
                       update_mode=update.mode)


PAUSE_VARIABLE = "MAE_TEST_PAUSE_AT_STEP"


def pause_step_for_tests() -> int | None:
    """The update after which :func:`hold_for_tests` holds the loop: ``MAE_TEST_PAUSE_AT_STEP=N``
    in the environment (read once per run), else None.

    Interrupt tests signal a run at a known step instead of racing a timer against the loop: a
    fast machine no longer finishes training before the signal lands."""
    value = os.environ.get(PAUSE_VARIABLE)
    return int(value) if value else None


def hold_for_tests(should_stop: Callable[[], bool] | None, limit_s: float = 900.0) -> None:
    """Hold the loop (its log and checkpoint of the update written) until a stop is asked, the
    process is killed, or ``limit_s`` passes."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not (should_stop is not None and should_stop()):
        time.sleep(0.05)


def batch_target(patches: torch.Tensor, kind: str) -> torch.Tensor:
    """``T(x_j)`` of a batch ``[B,M,q] -> [B,M,out_dim or q]``: the registered target's function
    without its domain check (:func:`prepare_data` checked every training image once, and a
    check per step would wait for the GPU every step)."""
    return target_result(registry.targets.get(kind), patches)  # a plugin's result checked


def changed_keys(config: Config, saved: dict[str, Any]) -> list[str]:
    """Keys whose value differs from a checkpoint's config. A key the checkpoint predates
    (added to Config later) counts as unchanged while it keeps its default. ``compile_enabled``
    is not compared: it follows from ``compile`` and ``steps`` (compared) and the machine's
    device class, and a run may resume on another machine."""
    defaults = {name: field.default for name, field in Config.model_fields.items()}
    # A checkpoint written before the seed_* keys drew every source from its ``seed``.
    defaults.update({key: saved.get("seed") for key in SEED_SOURCES})
    return sorted(k for k, v in config.resolved().items()
                  if k != "compile_enabled"
                  and saved.get(k, defaults.get(k, v)) != v)


class DivergenceWatch:
    """Remembers the first update whose loss or gradient is non-finite, on the device.

    :meth:`observe` adds no host synchronisation (it matters on a GPU); :meth:`check` makes
    one and raises :class:`NonFiniteError` naming that first step, which the loop calls before
    anything is recorded or saved, so no checkpoint or logged loss ever holds a non-finite value.
    """

    def __init__(self, device: torch.device):
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.loss_was_bad = torch.zeros((), dtype=torch.bool, device=device)

    def observe(self, step: int | torch.Tensor, loss: torch.Tensor, model: nn.Module,
                check_gradients: bool = True) -> None:
        """``step``: t, or a 0-d device tensor holding it (a captured update). The record is
        updated in place, so a CUDA graph replaying this call keeps updating the same tensors."""
        grads = [p.grad for p in model.parameters() if p.grad is not None] if check_gradients else []
        loss_ok = torch.isfinite(loss.detach())
        grads_ok = (torch.isfinite(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
                    if grads else torch.ones_like(loss_ok))
        first = (self.first_bad < 0) & ~(loss_ok & grads_ok)
        self.first_bad.copy_(torch.where(first, step, self.first_bad))
        self.loss_was_bad.copy_(torch.where(first, ~loss_ok, self.loss_was_bad))

    def check(self, lr_at: Callable[[int], float]) -> None:
        step = int(self.first_bad)
        if step >= 0:
            raise NonFiniteError(step, "loss" if bool(self.loss_was_bad) else "gradient", lr_at(step))
