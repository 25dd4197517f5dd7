"""One trial end to end: train, evaluate, log everything to one MLflow run.

Used by ``mae-study train`` directly and by the Ray Tune trainable; it holds no Ray code.
A trial that is resumed (same checkpoint path) reopens its own MLflow run, whose id lives in
the checkpoint, and never logs a metric step twice.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient

from evaluation.reconstruction_grid import ARTIFACT as RECONSTRUCTIONS, close, render, save_npz
from evaluation.reconstructions import reconstruction_grid
from mae_core.config import Config
from evaluation import evaluate_trial
from evaluation.baselines import BaselineCache
from mae_core.models import config_variant_name
from mae_core.train import NonFiniteError, PatchData, train

from . import lifecycle, logged, tracking
from .interrupts import Interruption


BASELINES_TAG = "baselines"  # "computed KEY" or "reused KEY": see evaluation.baselines


@dataclass(frozen=True)
class TrialOutcome:
    run_id: str
    metrics: dict[str, float]
    train_seconds: float


def _log_reconstructions(client: MlflowClient, run_id: str, model, config: Config, data: PatchData) -> None:
    """The grid as a PNG (MLflow's UI) and as arrays (``reconstructions.npz``: the report
    redraws it at print size, as vector PDF, from the store alone)."""
    grid = reconstruction_grid(model, config, data.test_patches, data.image_shape, seed=config.seed)
    figure = render(grid)
    client.log_figure(run_id, figure, "reconstructions.png")
    close(figure)
    with tempfile.TemporaryDirectory() as folder:
        client.log_artifact(run_id, str(save_npz(grid, Path(folder) / RECONSTRUCTIONS)))


def trial_run_name(config: Config, prefix: str = "") -> str:
    """E.g. ``mae_vit_w64d4_dec32d2-r0.75-s0``: the variant, its ratio and its seed."""
    ratio = f"-r{config.mask_ratio:g}" if config.objective == "mae" else ""
    return f"{prefix}{config_variant_name(config)}{ratio}-s{config.seed}"


def run_trial(
    config: Config,
    data: PatchData,
    *,
    tracking_uri: str,
    experiment: str = tracking.DEFAULT_EXPERIMENT,
    run_name: str | None = None,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    checkpoint_path: Path | None = None,
    run_id: str | None = None,
    on_progress: Callable[[int, dict[str, float]], None] | None = None,
    on_checkpoint: Callable[[int, Path], None] | None = None,
    probes: bool = True,
    interruption: Interruption | None = None,
    baselines: BaselineCache | None = None,
) -> TrialOutcome:
    """Train and evaluate ``config`` on ``data``; one MLflow run holds all of it.

    ``run_id`` reopens a run the caller found; otherwise the run id kept in the checkpoint is
    reopened, or a new run is created (under ``parent_run_id``, with ``tags``). While the trial
    works its run is MLflow's active run, with system metrics; it logs the data splits as
    inputs and the trained encoder as a model (:mod:`studies.logged`). The evaluation layer measures the trained model
    (:func:`evaluation.evaluate_trial`; ``probes=False`` keeps to the risks). A diverging trial ends FAILED with ``failure_step`` and
    ``failure_reason`` tags, and the error is re-raised. With ``interruption``, a first
    SIGINT/SIGTERM during training stops after the current update with a checkpoint; an
    interrupted trial ends KILLED with the signal as its ``interrupted`` tag. ``baselines``: the
    study's shared baselines (:mod:`evaluation.baselines`); the ``baselines`` tag then says
    whether this trial computed its set or read it (and its key).
    """
    client = MlflowClient(tracking_uri)
    with lifecycle.opened(client, run_id or lifecycle.run_in_checkpoint(checkpoint_path),
                          tracking_uri=tracking_uri, experiment=experiment,
                          run_name=run_name or trial_run_name(config), parent_run_id=parent_run_id,
                          tags=tags) as run_id:
        metrics, train_seconds = _train_and_evaluate(
            client, run_id, config, data, checkpoint_path=checkpoint_path, on_progress=on_progress,
            on_checkpoint=on_checkpoint, probes=probes, interruption=interruption, baselines=baselines)
        lifecycle.finished(client, run_id)
    return TrialOutcome(run_id=run_id, metrics=metrics, train_seconds=train_seconds)


def _train_and_evaluate(client: MlflowClient, run_id: str, config: Config, data: PatchData, *,
                        checkpoint_path: Path | None, on_progress, on_checkpoint, probes: bool,
                        interruption: Interruption | None,
                        baselines: BaselineCache | None) -> tuple[dict[str, float], float]:
    """The trial's work inside its active run: (final metrics, training seconds)."""
    tracking.log_params(client, run_id, config.resolved())
    logged.log_dataset_inputs(client, run_id, config, data)
    already = tracking.logged_steps(client, run_id, "train_loss")

    def on_log(step: int, metrics: dict[str, float]) -> None:
        if step not in already:
            tracking.log_metrics(client, run_id, metrics, step, int(time.time() * 1000))
        if on_progress is not None:
            on_progress(step, metrics)

    started = time.perf_counter()
    try:
        with interruption.deferred() if interruption is not None else nullcontext():
            result = train(config, data, checkpoint_path=checkpoint_path, on_log=on_log,
                           on_checkpoint=on_checkpoint, checkpoint_extra={"mlflow_run_id": run_id},
                           should_stop=interruption.requested if interruption is not None else None)
    except NonFiniteError as error:
        lifecycle.diverged(client, run_id, error.step, str(error))
        raise
    except BaseException as error:  # interrupted: leave the run resumable, say why
        lifecycle.interrupted(client, run_id, error, interruption and interruption.reason)
        raise
    train_seconds = time.perf_counter() - started
    if result.resumed_from is not None:
        tracking.set_tags(client, run_id, {"resumed_from_step": result.resumed_from})
    if result.warnings:
        tracking.set_tags(client, run_id, {"checkpoint_warning": " | ".join(result.warnings)})

    try:
        served = len(baselines.outcomes) if baselines is not None else 0
        metrics = evaluate_trial(result.model, config, data, probes=probes, baselines=baselines)
    except BaseException as error:  # e.g. Ctrl-C during the probes: the checkpoint is final
        lifecycle.interrupted(client, run_id, error, interruption and interruption.reason)
        raise
    if baselines is not None and len(baselines.outcomes) > served:
        key, how = baselines.outcomes[-1]
        tracking.set_tags(client, run_id, {BASELINES_TAG: f"{how} {key}"})
    metrics["train_seconds"] = train_seconds  # (effective_mask_ratio is a param: each value is logged once)
    # A trial retried after this point must not log its final metrics a second time.
    already_logged = client.get_run(run_id).data.metrics
    fresh = {k: v for k, v in metrics.items() if k not in already_logged}
    tracking.log_metrics(client, run_id, fresh, config.steps, int(time.time() * 1000))

    _log_reconstructions(client, run_id, result.model, config, data)
    if checkpoint_path is not None and Path(checkpoint_path).exists():
        client.log_artifact(run_id, str(checkpoint_path), artifact_path="checkpoint")
    logged.log_encoder(client, run_id, result.model, config, data.test_patches[:2])
    return metrics, train_seconds
