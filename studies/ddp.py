"""One Ray Tune trial trained across devices (issue 26 part 5, ``--workers-per-trial N``).

The Tune trial launches a Ray Train ``TorchTrainer`` with N workers (gloo on CPUs, NCCL on
GPUs); every worker runs :func:`mae_core.train.train` on its :class:`~mae_core.distributed.Shard`
of each global batch. Rank 0 runs the whole trial (:func:`studies.trial.run_trial`: its one
MLflow child run, the evaluation, the final metrics) and writes the outcome where the Tune trial
reads it; the other ranks only train. The checkpoint lives in the study's folder under the
parent run and the trial's cell id, so a retried or resumed trial continues from it. Every
worker must see that folder: a local study (on a multi-node cluster, a shared file system).
The trial is the :class:`~studies.trial_request.TrialRequest` a one-process trial gets, so trials
that differ only in ``eval.*`` keys share one encoder here too (:mod:`studies.pretrained`, under
a key that counts the workers): rank 0 claims the key, and the other ranks train with it only
when it trains (:func:`studies.trial.pretraining_decided`). A rank waiting for that answer waits
as long as another trial holding the key takes to train it, within the process group's timeout
(Ray Train's default is 30 minutes; past it the trial fails and Ray retries it, which then reads
the kept encoder).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (torch and MLflow: imported in the workers, not with the trainable)
    from mae_core.distributed import Shard

    from .trial_request import TrialRequest

OUTCOME_FILE = "outcome.json"
CHECKPOINTS_DIR = "checkpoints"  # <study out>/checkpoints/<parent run id>/<cell id>/checkpoint.pt


def worker_loop(loop: dict[str, Any]) -> None:
    """``train_loop_per_worker`` of the trainer: one rank's part of the trial (``loop["request"]``)."""
    import ray.train
    import ray.train.torch

    from mae_core.distributed import Shard

    context = ray.train.get_context()
    shard = Shard(context.get_world_rank(), context.get_world_size(), device=str(ray.train.torch.get_device()))
    run_rank(loop["request"], shard)


def run_rank(request: TrialRequest, shard: Shard) -> None:
    """Rank ``shard.rank`` of a data-parallel trial (:func:`studies.trial_request.run_request`);
    rank 0 writes the trial's outcome beside its checkpoint, where the Tune trial reads it. Needs
    only a process group, so a test runs it on local gloo processes without Ray."""
    import torch

    from mae_core.plugins import load_plugins
    from mae_core.updates import NonFiniteError

    from .trial_request import run_request

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    load_plugins(list(request.plugins))  # the driver's plugins, before the config's parts are looked up
    if shard.rank != 0:
        run_request(request, shard=shard)
        return
    outcome = Path(request.checkpoint_path).parent / OUTCOME_FILE
    last = {"train_loss": float("nan")}
    try:
        result = run_request(request, shard=shard, on_progress=lambda step, metrics: last.update(metrics))
    except NonFiniteError as error:
        outcome.write_text(json.dumps({"diverged": 1.0, "step": error.step, "failure_reason": str(error)}))
        raise
    outcome.write_text(json.dumps({"diverged": 0.0, "step": request.config.steps, "train_loss": last["train_loss"],
                                   **result.metrics}))


def train_on_workers(request: TrialRequest, *, workers: int, cpus_per_worker: float, gpus_per_worker: float,
                     storage: Path) -> dict[str, Any]:
    """Run ``request`` on ``workers`` Ray Train workers (:func:`worker_loop`); rank 0's outcome
    (the trial's final metrics, or ``diverged: 1`` with its step and reason). A worker that fails
    otherwise raises Ray Train's error, which Ray Tune retries as a crashed trial."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    outcome = Path(request.checkpoint_path).parent / OUTCOME_FILE
    outcome.parent.mkdir(parents=True, exist_ok=True)
    outcome.unlink(missing_ok=True)
    resources = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker > 0 else {})}
    trainer = TorchTrainer(
        worker_loop, train_loop_config={"request": request},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpus_per_worker > 0,
                                     resources_per_worker=resources),
        run_config=RunConfig(name=f"train-{Path(request.checkpoint_path).parent.name}", storage_path=str(storage)),
    )
    try:
        trainer.fit()
    except Exception:
        if outcome.exists():  # diverged on every rank: rank 0 recorded why
            return json.loads(outcome.read_text())
        raise
    return json.loads(outcome.read_text())
