"""The Ray Tune trainable: one trial of a study, run in a Ray worker, as one MLflow child run.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from mae_core.config import Config

from . import lifecycle
from .lifecycle import RayCheckpoints
from .study import cell_id, trial_keys


def shared_encoders(baseline_dir: str | None, trial_config: dict[str, Any], lengths: tuple[int, ...]) -> Path | None:
    """Where a trial's study keeps trained encoders (:mod:`studies.pretrained`), or None where
    trials do not share them: only beside shared baselines (a local study), and only where
    cells differ in ``eval.*`` keys (or ``seed_eval``), which train one encoder per seed, or
    in lengths, a shorter one read from a longer run where it is a prefix of it."""
    from .pretrained import PRETRAINED_DIR  # (torch: imported where a trial runs, not with the CLI)

    varied = trial_keys(trial_config)
    if not baseline_dir or not (lengths or any(k.startswith("eval.") or k == "seed_eval" for k in varied)):
        return None
    return Path(baseline_dir).parent / PRETRAINED_DIR


def trial_request(config: Config, trial_config: dict[str, Any], *, study_name: str, cell: str, tracking_uri: str,
                  experiment: str, parent_run_id: str, run_id: str | None, tags: dict[str, str],
                  baseline_dir: str | None, lengths: tuple[int, ...], plugins: list[str] | None,
                  folder: str | None = None):
    """The :class:`~studies.trial_request.TrialRequest` of a study's trial; ``folder`` (the
    study's, for a trial on several workers): its checkpoint there, under the parent run and the
    cell (a fresh study in the same ``--out`` never resumes another's). A one-process trial's
    checkpoint is Ray's to place (:class:`~studies.lifecycle.RayCheckpoints`)."""
    from .ddp import CHECKPOINTS_DIR
    from .trial import trial_run_name
    from .trial_request import TrialRequest

    return TrialRequest(config, tracking_uri, experiment=experiment, run_name=trial_run_name(config),
                        run_id=run_id, parent_run_id=parent_run_id, study=study_name, cell=cell, tags=tags,
                        checkpoint_path=(Path(folder) / CHECKPOINTS_DIR / parent_run_id / cell / "checkpoint.pt"
                                         if folder is not None else None),
                        baseline_dir=Path(baseline_dir) if baseline_dir else None,
                        pretrained_dir=shared_encoders(baseline_dir, trial_config, lengths),
                        lengths=tuple(lengths), plugins=tuple(plugins or ()))


def trainable(trial_config: dict[str, Any], *, base: dict[str, Any], study_name: str,
              tracking_uri: str, experiment: str, parent_run_id: str, search: bool = False,
              baseline_dir: str | None = None, workers: dict[str, Any] | None = None,
              plugins: list[str] | None = None, lengths: tuple[int, ...] = ()) -> None:
    """One Ray Tune trial: a grid cell trained, evaluated and logged to its own MLflow run.
    In a search, a trial's run is found by its Ray trial id as well (two samples may draw the
    same values, and each is its own trial). Baselines are shared through ``baseline_dir``
    (:mod:`evaluation.baselines`); where a trial's varied keys include an ``eval.*`` key, so do
    trained encoders, in the ``pretrained/`` folder beside it (:func:`shared_encoders`).
    ``workers`` (``workers``, ``cpus``, ``gpus``, ``folder``): the trial trains on that many Ray
    Train workers (:mod:`studies.ddp`), its checkpoint kept under ``folder``; it is the same
    :class:`~studies.trial_request.TrialRequest` either way, shared encoders included. ``plugins``: the
    driver's (:func:`mae_core.plugins.loaded_specs`), imported here before the config is built;
    None reads them from ``MAE_STUDY_PLUGINS``. ``lengths``: the study's training lengths
    (:func:`studies.planning.shared_lengths`): a trial keeps its model at the shorter ones that
    its run passes through, for their trials (:mod:`studies.pretrained`)."""
    import ray
    import torch
    from mlflow.tracking import MlflowClient
    from ray import tune

    from mae_core.plugins import load_from_environment, load_plugins
    from mae_core.devices import resolve_device
    from mae_core.updates import NonFiniteError

    from .trial_request import run_request

    # Ray sets OMP_NUM_THREADS to the trial's CPU share; torch must use the same number.
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    if plugins is None:
        load_from_environment()
    else:
        load_plugins(plugins)
    keys = {**base, **trial_keys(trial_config)}
    config = Config(**keys)
    client = MlflowClient(tracking_uri)
    identity = {**keys, "ray_trial_id": tune.get_context().get_trial_id()} if search else keys
    cell = cell_id(identity)
    run_id = lifecycle.run_for_cell(client, tracking_uri=tracking_uri, experiment=experiment,
                                    parent_run_id=parent_run_id, cell=cell)
    if run_id is not None and (run := client.get_run(run_id)).info.status == "FINISHED":
        # The driver died after this trial finished but before Ray recorded it: do not run it again.
        tune.report({"step": config.steps, "diverged": 0.0, **run.data.metrics})
        return
    context = ray.get_runtime_context()
    tags = {"ray_node_id": context.get_node_id(),
            "ray_gpu_ids": ",".join(context.get_accelerator_ids().get("GPU", [])),
            # the device the trial trains and evaluates on: Ray makes its GPU(s) the visible ones
            "trial_device": str(resolve_device(config.device)),
            "ray_trial_id": tune.get_context().get_trial_id(), "ray_worker_pid": str(os.getpid())}
    request = trial_request(config, trial_config, study_name=study_name, cell=cell, tracking_uri=tracking_uri,
                            experiment=experiment, parent_run_id=parent_run_id, run_id=run_id, tags=tags,
                            baseline_dir=baseline_dir, lengths=lengths, plugins=plugins,
                            folder=workers["folder"] if workers is not None else None)
    if workers is not None:
        from .ddp import train_on_workers

        tune.report(train_on_workers(request, workers=workers["workers"], cpus_per_worker=workers["cpus"],
                                     gpus_per_worker=workers["gpus"], storage=Path(workers["folder"]) / "ray-train"))
        return
    checkpoints = RayCheckpoints()
    checkpoints.restore()
    last = {"train_loss": float("nan")}

    def on_checkpoint(step: int, path: Path) -> None:
        if step < config.steps:  # the final report below carries the final checkpoint's metrics
            checkpoints.report({"step": step, "train_loss": last["train_loss"]})

    try:
        outcome = run_request(replace(request, checkpoint_path=checkpoints.path),
                              on_progress=lambda step, metrics: last.update(metrics), on_checkpoint=on_checkpoint)
    except NonFiniteError as error:
        # Fails alone, with its reason in MLflow (run_trial marked it); Ray must not retry it.
        tune.report({"step": error.step, "diverged": 1.0, "failure_reason": str(error),
                     "train_loss": float("inf")})
        return
    finally:
        checkpoints.close()
    tune.report({"step": config.steps, "diverged": 0.0, "train_loss": last["train_loss"], **outcome.metrics})
