"""One Ray Tune trial trained across devices (issue 26 part 5, ``--workers-per-trial N``).

The Tune trial launches a Ray Train ``TorchTrainer`` with N workers (gloo on CPUs, NCCL on
GPUs); every worker runs :func:`mae_core.train.train` on its :class:`~mae_core.distributed.Shard`
of each global batch. Rank 0 runs the whole trial (:func:`studies.trial.run_trial`: its one
MLflow child run, the evaluation, the final metrics) and writes the outcome where the Tune trial
reads it; the other ranks only train. The checkpoint lives in the study's folder under the
parent run and the trial's cell id, so a retried or resumed trial continues from it. Every
worker must see that folder: a local study (on a multi-node cluster, a shared file system).
Trials that differ only in ``eval.*`` keys each train their own encoder here (the one-process
trials share one, :mod:`studies.pretrained`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

OUTCOME_FILE = "outcome.json"
CHECKPOINTS_DIR = "checkpoints"  # <study out>/checkpoints/<parent run id>/<cell id>/checkpoint.pt


def worker_loop(loop: dict[str, Any]) -> None:
    """``train_loop_per_worker`` of the trainer: one rank's part of the trial."""
    import ray.train
    import ray.train.torch
    import torch

    from evaluation.baselines import BaselineCache
    from mae_core.config import Config
    from mae_core.distributed import Shard
    from mae_core.plugins import load_plugins
    from mae_core.train import NonFiniteError, prepare_data, train

    from .trial import run_trial

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    context = ray.train.get_context()
    device = ray.train.torch.get_device()
    shard = Shard(context.get_world_rank(), context.get_world_size(), device=str(device))
    load_plugins(loop.get("plugins") or [])  # the driver's plugins, before the config names their parts
    config = Config(**loop["keys"])
    data = prepare_data(config)
    checkpoint = Path(loop["checkpoint_path"])
    if shard.rank != 0:
        train(config, data, checkpoint_path=checkpoint, shard=shard)
        return
    outcome = checkpoint.parent / OUTCOME_FILE
    last = {"train_loss": float("nan")}
    try:
        result = run_trial(config, data, tracking_uri=loop["tracking_uri"], experiment=loop["experiment"],
                           run_id=loop["run_id"], run_name=loop["run_name"], parent_run_id=loop["parent_run_id"],
                           tags=loop["tags"], checkpoint_path=checkpoint,
                           baselines=BaselineCache(Path(loop["baseline_dir"])) if loop["baseline_dir"] else None,
                           on_progress=lambda step, metrics: last.update(metrics), shard=shard)
    except NonFiniteError as error:
        outcome.write_text(json.dumps({"diverged": 1.0, "step": error.step, "failure_reason": str(error)}))
        raise
    outcome.write_text(json.dumps({"diverged": 0.0, "step": config.steps, "train_loss": last["train_loss"],
                                   **result.metrics}))


def train_on_workers(loop: dict[str, Any], *, workers: int, cpus_per_worker: float, gpus_per_worker: float,
                     storage: Path) -> dict[str, Any]:
    """Run :func:`worker_loop` on ``workers`` Ray Train workers; rank 0's outcome (the trial's
    final metrics, or ``diverged: 1`` with its step and reason). A worker that fails otherwise
    raises Ray Train's error, which Ray Tune retries as a crashed trial."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    outcome = Path(loop["checkpoint_path"]).parent / OUTCOME_FILE
    outcome.parent.mkdir(parents=True, exist_ok=True)
    outcome.unlink(missing_ok=True)
    resources = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker > 0 else {})}
    trainer = TorchTrainer(
        worker_loop, train_loop_config=loop,
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpus_per_worker > 0,
                                     resources_per_worker=resources),
        run_config=RunConfig(name=f"train-{Path(loop['checkpoint_path']).parent.name}", storage_path=str(storage)),
    )
    try:
        trainer.fit()
    except Exception:
        if outcome.exists():  # diverged on every rank: rank 0 recorded why
            return json.loads(outcome.read_text())
        raise
    return json.loads(outcome.read_text())
