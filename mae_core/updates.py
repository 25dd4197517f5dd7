"""One update of the spec's procedure, eager or capturable (spec, steps 1-3 for one ``t``).

:class:`EagerUpdate` draws ``I_t`` and ``V_t`` (and the DAE's corruption) when it runs;
:class:`CapturableUpdate` runs the same updates with nothing read from the host (step size and
step count on the device, ``I_t`` and ``V_t`` drawn ahead in the same order), so that on CUDA
``cuda_graph`` can capture one whole update and replay it; on the CPU it gives the eager loop's
numbers. :class:`DivergenceWatch` remembers, on the device, the first update whose loss or
gradient left the reals (the spec requires a finite gradient at every iterate).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from warnings import warn

import torch
from torch import nn

from . import registry
from .augment import augment
from .config import Config
from .distributed import Shard
from .images import DeviceImages
from .objective_classes import Draw
from .optimizer import make_capturable
from .patches import patchify
from .plugin_checks import target_result
from .precision import resolve_precision
from .registry import Objective


class NonFiniteError(FloatingPointError):
    """The loss or its gradient left the reals at update ``step`` (0-based t of the spec)."""

    def __init__(self, step: int, what: str, lr: float):
        self.step, self.what = step, what
        super().__init__(f"non-finite {what} at step t={step} (lr={lr:.3g}); the spec requires a finite gradient at every iterate")



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


def batch_target(patches: torch.Tensor, kind: str) -> torch.Tensor:
    """``T(x_j)`` of a batch ``[B,M,q] -> [B,M,out_dim or q]``: the registered target's function
    without its domain check (:func:`prepare_data` checked every training image once, and a
    check per step would wait for the GPU every step)."""
    return target_result(registry.targets.get(kind), patches)  # a plugin's result checked



def noise_generator(config: Config, device: torch.device, sampler: torch.Generator) -> torch.Generator:
    """Where the objective draws what is not the sampler's (the DAE's corruption ``X̃``): the
    sampler, or a generator of its own off the CPU (:meth:`mae_core.objective_classes.DAE.noise_generator`)."""
    return config.objective_spec.noise_generator(config, device, sampler)


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
    if config.objective_spec.capture_blocker is not None:
        return f"objective={config.objective} {config.objective_spec.capture_blocker}"
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

    @property
    def objective(self) -> Objective:
        return self.config.objective_spec

    def loss(self, clean: torch.Tensor, draw: Draw) -> torch.Tensor:
        """``L_t`` of the objective (:meth:`~mae_core.registry.Objective.loss`) for the clean
        patches ``[B,M,q]`` and what it drew, against ``T(clean)``."""
        return self.objective.loss(self.predict, clean, batch_target(clean, self.config.target), draw)

    def predict(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The model's predictions ``[B,M,d]`` under the run's autocast, as fp32 (the loss is fp32)."""
        with self.autocast:
            pred = self.forward(*inputs)
        return pred.float()

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
        whole = config.augment != "none" or p.objective.reads_images
        # the augmentation (none by default: it draws nothing then) draws from the same sampler
        clean = patchify(augment(p.images(index if whole else index[rows]), config.augment, p.sampler,
                                 self.value_range), p.patch_size)  # [B,M,q] (this rank's rows of it)
        # V_t (MAE) or X̃ drawn beside the images (DAE; on the CPU from the sampler)
        draw = p.objective.draw(clean, config, p.sampler, p.sampler if p.noise is None else p.noise,
                                config.batch_size)
        draw = draw.rows(rows).to(clean.device)
        if p.images.reader is not None and t + 1 < config.steps:  # images on disk: read I_{t+1} meanwhile
            following = self.next_index(len(p.images), config.batch_size)
            p.images.prefetch(following if whole else following[rows])
        p.step(t, p.loss(clean[rows] if whole else clean, draw))

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
        self.index = torch.zeros(DRAW_AHEAD, config.batch_size, dtype=torch.long, device=device)  # I_t of the drawn updates
        self.visible: torch.Tensor | None = None  # V_t of the drawn updates, made on the first draw that has one
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
            drawn = self.parts.objective.draw_ahead(config, sampler, config.batch_size)
            if drawn.visible is not None:
                visible.append(drawn.visible)
        states.append(sampler.get_state())
        self.states, self.first, self.end = states, t, t + count
        self.host_index = torch.stack(index)
        # stream-ordered after every update already queued, which may still read the old draws
        self.index[:count].copy_(self.host_index, non_blocking=True)
        if visible:
            if self.visible is None:  # allocated before any capture: every replay reads these buffers
                self.visible = torch.zeros(DRAW_AHEAD, *visible[0].shape, dtype=torch.long, device=self.device)
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
        p.step(self.step, p.loss(clean, Draw(visible=visible)))
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

