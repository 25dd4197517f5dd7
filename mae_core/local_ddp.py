"""DDP on local processes, outside Ray: ``world_size`` gloo processes on this machine train one
config as :func:`mae_core.train.train` does with a :class:`~mae_core.distributed.Shard` each.
For tests and single-machine checks that several workers equal one process; studies run
several workers through Ray Train instead (:mod:`studies.ddp`)."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .distributed import Shard, local_batch_size


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, config_keys: dict[str, Any], out: str,
            train_kwargs: dict[str, Any]) -> None:
    from .config import Config
    from .data import prepare_data
    from .train import train

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
