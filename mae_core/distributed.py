"""One training run across N processes (issue 26 part 5): data-parallel updates with the
spec's sampling law.

Every rank draws the global batch's ``I_t`` and ``V_t`` (and any augmentation or corruption)
from the same sampler in the same order as the single-process loop, then keeps its contiguous
slice of ``batch_size / N`` images: the union over ranks of one update is the single-process
update. Each rank's loss is the mean over its slice, and DDP averages the gradients across ranks,
which is the single-process mean gradient because the slices are equal. Only rank 0 writes
checkpoints; every rank reads the same one on resume.

:func:`train_on_processes` runs the loop on N local gloo processes (the CPU test, and a run
without Ray); the Ray Train driver in ``studies`` builds a :class:`Shard` from its own context.
"""

from __future__ import annotations

import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, config_keys: dict[str, Any], out: str,
            train_kwargs: dict[str, Any]) -> None:
    from .config import Config
    from .train import prepare_data, train

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.set_num_threads(1)
        config = Config(**config_keys)
        result = train(config, prepare_data(config), shard=Shard(rank, world_size), **train_kwargs)
        torch.save({"model": result.model.state_dict(), "history": result.history, "steps": result.steps,
                    "resumed_from": result.resumed_from}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def train_on_processes(config, world_size: int, *, checkpoint_path: Path | None = None,
                       all_ranks: bool = False):
    """Train ``config`` on ``world_size`` local gloo processes (CPU); return rank 0's
    :class:`~mae_core.train.TrainResult` (with ``all_ranks``: every rank's, in rank order)."""
    import torch.multiprocessing as mp

    from .models import build_model
    from .train import TrainResult

    local_batch_size(config.batch_size, world_size)
    keys = config.model_dump()
    kwargs = {"checkpoint_path": checkpoint_path}
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(world_size, free_port(), keys, out, kwargs), nprocs=world_size, join=True)
        results = []
        for rank in range(world_size if all_ranks else 1):
            saved = torch.load(Path(out) / f"rank{rank}.pt", weights_only=True)
            model = build_model(config)
            model.load_state_dict(saved["model"])
            results.append(TrainResult(model=model.eval(), steps=saved["steps"],
                                       history=[(int(s), float(v)) for s, v in saved["history"]],
                                       resumed_from=saved["resumed_from"]))
    return results if all_ranks else results[0]
