"""One trial end to end: train, evaluate, log everything to one MLflow run.

Used by ``mae-study train`` directly and by the Ray Tune trainable; it holds no Ray code.
A trial that is resumed (same checkpoint path) reopens its own MLflow run, whose id lives in
the checkpoint, and never logs a metric step twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient

from analysis.reconstructions import close, reconstruction_figure
from mae_core.config import Config
from mae_core.evaluation import reconstruction_metrics
from mae_core.models import config_variant_name
from mae_core.train import NonFiniteError, PatchData, load_latest_checkpoint, train

from . import tracking
from .interrupts import Interruption


@dataclass(frozen=True)
class TrialOutcome:
    run_id: str
    metrics: dict[str, float]
    train_seconds: float


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
    evaluate: Callable[..., dict[str, float]] | None = None,
    interruption: Interruption | None = None,
) -> TrialOutcome:
    """Train and evaluate ``config`` on ``data``; one MLflow run holds all of it.

    ``run_id`` reopens a run the caller made; otherwise the run id kept in the checkpoint is
    reopened, or a new run is created. ``evaluate(model, config, data)`` adds downstream metrics
    (probes) when given. A diverging trial ends FAILED with ``failure_step`` and
    ``failure_reason`` tags, and the error is re-raised. With ``interruption``, a first
    SIGINT/SIGTERM during training stops after the current update with a checkpoint; an
    interrupted trial ends KILLED with the signal as its ``interrupted`` tag.
    """
    client = MlflowClient(tracking_uri)
    run_id = run_id or _reopen_or_create(client, config, tracking_uri, experiment, run_name,
                                         parent_run_id, tags, checkpoint_path)
    tracking.reopen(client, run_id)
    tracking.log_params(client, run_id, config.resolved())
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
        tracking.set_tags(client, run_id, {"failure_step": error.step, "failure_reason": str(error)})
        client.set_terminated(run_id, "FAILED")
        raise
    except BaseException as error:  # interrupted: leave the run resumable, say why
        _mark_interrupted(client, run_id, error, interruption)
        raise
    train_seconds = time.perf_counter() - started
    if result.resumed_from is not None:
        tracking.set_tags(client, run_id, {"resumed_from_step": result.resumed_from})
    if result.warnings:
        tracking.set_tags(client, run_id, {"checkpoint_warning": " | ".join(result.warnings)})

    try:
        metrics = reconstruction_metrics(result.model, config, data)
        if evaluate is not None:
            metrics.update(evaluate(result.model, config, data))
    except BaseException as error:  # e.g. Ctrl-C during the probes: the checkpoint is final
        _mark_interrupted(client, run_id, error, interruption)
        raise
    metrics["train_seconds"] = train_seconds
    metrics["effective_mask_ratio"] = config.effective_mask_ratio
    # A trial retried after this point must not log its final metrics a second time.
    logged = client.get_run(run_id).data.metrics
    fresh = {k: v for k, v in metrics.items() if k not in logged}
    tracking.log_metrics(client, run_id, fresh, config.steps, int(time.time() * 1000))

    figure = reconstruction_figure(result.model, config, data.test_patches, data.image_shape, seed=config.seed)
    client.log_figure(run_id, figure, "reconstructions.png")
    close(figure)
    if checkpoint_path is not None and Path(checkpoint_path).exists():
        client.log_artifact(run_id, str(checkpoint_path), artifact_path="checkpoint")
    client.set_terminated(run_id, "FINISHED")
    return TrialOutcome(run_id=run_id, metrics=metrics, train_seconds=train_seconds)


def _mark_interrupted(client, run_id: str, error: BaseException, interruption) -> None:
    """A signal or exit: KILLED with the signal as the ``interrupted`` tag (resumable). Any
    other error: FAILED with it as ``failure_reason`` (Ray may retry it; a retry reopens the run)."""
    if isinstance(error, Exception):
        tracking.set_tags(client, run_id, {"failure_reason": f"{type(error).__name__}: {error}"[:500]})
        client.set_terminated(run_id, "FAILED")
        return
    reason = interruption.reason if interruption is not None else type(error).__name__
    tracking.set_tags(client, run_id, {"interrupted": reason})
    client.set_terminated(run_id, "KILLED")


def _reopen_or_create(client, config, tracking_uri, experiment, run_name, parent_run_id, tags,
                      checkpoint_path) -> str:
    if checkpoint_path is not None:
        state, _ = load_latest_checkpoint(checkpoint_path)
        run_id = (state or {}).get("extra", {}).get("mlflow_run_id")
        if run_id:
            return run_id
    experiment_id = tracking.ensure_experiment(client, experiment, tracking_uri)
    return tracking.create_run(client, experiment_id, run_name or trial_run_name(config),
                               parent_run_id, tags)
