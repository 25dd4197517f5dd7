"""One training run across N processes (issue 26 part 5): data-parallel updates with the
spec's sampling law.

Every rank draws the global batch's ``I_t`` and ``V_t`` (and any augmentation or corruption)
from the same sampler in the same order as the single-process loop, then keeps its contiguous
slice of ``batch_size / N`` images: the union over ranks of one update is the single-process
update. Each rank's loss is the mean over its slice, and DDP averages the gradients across ranks,
which is the single-process mean gradient because the slices are equal. Only rank 0 writes
checkpoints; every rank reads the same one on resume.

:func:`mae_core.local_ddp.train_on_processes` runs the loop on N local gloo processes (the CPU test, and a run
without Ray); the Ray Train driver in ``studies`` builds a :class:`Shard` from its own context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Shard:
    """This process's place in a data-parallel run: ``rank`` of ``world_size``, and the device
    it trains on (None: the config's ``device``)."""

    rank: int = 0
    world_size: int = 1
    device: str | None = None

    @property
    def active(self) -> bool:
        """More than one process: gradients, losses and stop requests cross ranks."""
        return self.world_size > 1

    def rows(self, batch_size: int) -> slice:
        """This rank's contiguous slice of the global batch of ``batch_size`` images."""
        local = local_batch_size(batch_size, self.world_size)
        return slice(self.rank * local, (self.rank + 1) * local)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean over ranks of a 0-d tensor (itself for one process)."""
        if not self.active:
            return value
        value = value.detach().clone()
        dist.all_reduce(value)
        return value / self.world_size

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank when ``flag`` is true on one (a stop request seen by one process)."""
        if not self.active:
            return flag
        value = torch.tensor(int(flag), device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value)

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def local_batch_size(batch_size: int, workers: int) -> int:
    """``batch_size / workers`` images per rank; ValueError (one line) unless it divides."""
    if workers < 1:
        raise ValueError(f"workers_per_trial={workers}: needs at least 1 worker")
    if batch_size % workers:
        raise ValueError(f"batch_size={batch_size} is not divisible by workers_per_trial={workers}: "
                         "the global batch is split evenly across the workers")
    return batch_size // workers


def wrap_model(model: torch.nn.Module, shard: Shard, device: torch.device) -> torch.nn.Module:
    """``model`` as DDP when the run has several ranks (gradients averaged in backward)."""
    if not shard.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else None
    # find_unused_parameters: the AE/DAE and the MAE variants do not all touch every parameter
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)
