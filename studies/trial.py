"""One trial end to end: train, evaluate, log everything to one MLflow run.

``mae-study train``, the Ray Tune trainable and the data-parallel workers reach it through
:func:`studies.trial_request.run_request`; it holds no Ray code.
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

import torch
from mlflow.tracking import MlflowClient

from evaluation.reconstruction_grid import ARTIFACT as RECONSTRUCTIONS, close, render, save_npz
from evaluation.reconstructions import can_draw, reconstruction_grid
from mae_core.config import Config
from evaluation import evaluate_trial
from evaluation.baselines import BaselineCache
from evaluation.online import METRIC_NAMES as ONLINE_METRICS
from mae_core.compute import compute_metrics
from mae_core.distributed import Shard
from mae_core.models import build_model, config_variant_name
from mae_core.checkpoint import load_latest_checkpoint
from mae_core.data import PatchData
from mae_core.devices import resolve_device
from mae_core.train import TrainResult, train
from mae_core.updates import NonFiniteError

from . import lifecycle, pretrained as shared, run_artifacts, testing_hooks, tracking
from .interrupts import Interruption


BASELINES_TAG = "baselines"  # "computed KEY" or "reused KEY": see evaluation.baselines
WORKERS_TAG = "workers_per_trial"  # processes one trial's training ran on (absent: one)


@dataclass(frozen=True)
class TrialOutcome:
    run_id: str
    metrics: dict[str, float]
    train_seconds: float


def _log_reconstructions(client: MlflowClient, run_id: str, model, config: Config, data: PatchData) -> None:
    """The grid as a PNG (MLflow's UI) and as arrays (``reconstructions.npz``: the report
    redraws it at print size, as vector PDF, from the store alone). A target without an
    inverse (a plugin's summary of each patch) has no pixels to draw: nothing is logged."""
    if not can_draw(config):
        return
    grid = reconstruction_grid(model, config, data.test_patches, data.image_shape, seed=config.eval_seed)
    figure = render(grid)
    client.log_figure(run_id, figure, "reconstructions.png")
    close(figure)
    with tempfile.TemporaryDirectory() as folder:
        client.log_artifact(run_id, str(save_npz(grid, Path(folder) / RECONSTRUCTIONS)))


def trial_run_name(config: Config, prefix: str = "") -> str:
    """E.g. ``mae_vit_w64d4_dec32d2-r0.75-s0``: the variant, its ratio and its seed."""
    ratio = f"-r{config.mask_ratio:g}" if config.objective_spec.masked else ""
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
    pretrained: shared.PretrainedCache | None = None,
    shard: Shard = Shard(),
) -> TrialOutcome:
    """Train and evaluate ``config`` on ``data``; one MLflow run holds all of it.

    ``run_id`` reopens a run the caller found; otherwise the run id kept in the checkpoint is
    reopened, or a new run is created (under ``parent_run_id``, with ``tags``). While the trial
    works its run is MLflow's active run, with system metrics; it logs the data splits as
    inputs and the trained encoder as a model (:mod:`studies.run_artifacts`). The evaluation layer measures the trained model
    (:func:`evaluation.evaluate_trial`; ``probes=False`` keeps to the risks). A diverging trial ends FAILED with ``failure_step`` and
    ``failure_reason`` tags, and the error is re-raised; any other error (a plugin's part breaking
    its rule, :mod:`mae_core.plugin_checks`; a crash) ends it FAILED with ``failure_reason``, and
    is re-raised. With ``interruption``, a first
    SIGINT/SIGTERM during training stops after the current update with a checkpoint; an
    interrupted trial ends KILLED with the signal as its ``interrupted`` tag. ``baselines``: the
    study's shared baselines (:mod:`evaluation.baselines`); the ``baselines`` tag then says
    whether this trial computed its set or read it (and its key). ``pretrained``: the study's
    shared encoders (:mod:`studies.pretrained`); a trial whose pretraining key another trial
    trained evaluates that encoder instead of training, and the ``pretraining`` tag says which.
    ``shard``: rank 0 of a data-parallel run (:mod:`mae_core.distributed`; the other ranks call
    :func:`~mae_core.train.train` alone), whose ``workers_per_trial`` is tagged.
    """
    client = MlflowClient(tracking_uri)
    with lifecycle.opened(client, run_id or lifecycle.run_in_checkpoint(checkpoint_path),
                          tracking_uri=tracking_uri, experiment=experiment,
                          run_name=run_name or trial_run_name(config), parent_run_id=parent_run_id,
                          tags=tags) as run_id:
        metrics, train_seconds = _train_and_evaluate(
            client, run_id, config, data, checkpoint_path=checkpoint_path, on_progress=on_progress,
            on_checkpoint=on_checkpoint, probes=probes, interruption=interruption, baselines=baselines,
            pretrained=pretrained, shard=shard)
        lifecycle.finished(client, run_id)
    return TrialOutcome(run_id=run_id, metrics=metrics, train_seconds=train_seconds)


def _train_and_evaluate(client: MlflowClient, run_id: str, config: Config, data: PatchData, *,
                        checkpoint_path: Path | None, on_progress, on_checkpoint, probes: bool,
                        interruption: Interruption | None,
                        baselines: BaselineCache | None,
                        pretrained: shared.PretrainedCache | None = None,
                        shard: Shard = Shard()) -> tuple[dict[str, float], float]:
    """The trial's work inside its active run: (final metrics, training seconds)."""
    tracking.log_params(client, run_id, config.resolved())
    if shard.active:  # the global batch is batch_size; each worker took batch_size / workers_per_trial
        tracking.set_tags(client, run_id, {WORKERS_TAG: shard.world_size})
    run_artifacts.log_dataset_inputs(client, run_id, config, data)
    already = tracking.logged_steps(client, run_id, "train_loss")

    def on_log(step: int, metrics: dict[str, float]) -> None:
        if step not in already:
            tracking.log_metrics(client, run_id, metrics, step, int(time.time() * 1000))
        if on_progress is not None:
            on_progress(step, metrics)

    def train_own(snapshot_steps=(), on_snapshot=None) -> tuple[TrainResult, float]:
        started = time.perf_counter()
        should_stop = interruption.requested if interruption is not None else None
        with interruption.deferred() if interruption is not None else nullcontext():
            result = train(config, data, checkpoint_path=checkpoint_path, on_log=on_log,
                           on_checkpoint=on_checkpoint, on_evaluate=_online_evaluation(client, run_id, config, data),
                           snapshot_steps=snapshot_steps, on_snapshot=on_snapshot,
                           checkpoint_extra={"mlflow_run_id": run_id},
                           should_stop=should_stop, shard=shard,
                           after_update=testing_hooks.pause_after_update(should_stop))
        return result, time.perf_counter() - started

    try:
        if pretrained is None:
            result, train_seconds = train_own()
        else:
            result, train_seconds = _shared_pretraining(client, run_id, config, data, pretrained, train_own,
                                                        on_log, checkpoint_path, shard)
    except NonFiniteError as error:
        lifecycle.diverged(client, run_id, error.step, str(error))
        raise
    except Exception as error:  # a plugin's broken rule (mae_core.plugin_checks), a crash: say why
        lifecycle.failed(client, run_id, error)
        raise
    except BaseException as error:  # interrupted (a signal, Ray stopping the trial): resumable, say why
        lifecycle.interrupted(client, run_id, error, interruption and interruption.reason)
        raise
    if result.resumed_from is not None:
        tracking.set_tags(client, run_id, {"resumed_from_step": result.resumed_from})
    if result.warnings:
        tracking.set_tags(client, run_id, {"checkpoint_warning": " | ".join(result.warnings)})

    try:
        served = len(baselines.outcomes) if baselines is not None else 0
        eval_started = time.perf_counter()
        testing_hooks.hold_in_evaluation()  # tests only: signal a trial known to be evaluating
        metrics = evaluate_trial(result.model, config, data, probes=probes, baselines=baselines)
        eval_seconds = time.perf_counter() - eval_started
    except Exception as error:  # e.g. an evaluator's undeclared metric: FAILED with the reason
        lifecycle.failed(client, run_id, error)
        raise
    except BaseException as error:  # e.g. Ctrl-C during the probes: the checkpoint is final
        lifecycle.interrupted(client, run_id, error, interruption and interruption.reason)
        raise
    if baselines is not None and len(baselines.outcomes) > served:
        key, how = baselines.outcomes[-1]
        tracking.set_tags(client, run_id, {BASELINES_TAG: f"{how} {key}"})
    metrics["train_seconds"] = train_seconds  # (effective_mask_ratio is a param: each value is logged once)
    # parameters, FLOPs per update (counted here, outside the loop), updates/s, pretrain/eval seconds
    metrics.update(compute_metrics(result.model, config, data, pretrain_seconds=train_seconds,
                                   updates=config.steps - (result.resumed_from or 0), eval_seconds=eval_seconds))
    # A trial retried after this point must not log its final metrics a second time.
    already_logged = client.get_run(run_id).data.metrics
    fresh = {k: v for k, v in metrics.items() if k not in already_logged}
    tracking.log_metrics(client, run_id, fresh, config.steps, int(time.time() * 1000))

    _log_reconstructions(client, run_id, result.model, config, data)
    if checkpoint_path is not None and Path(checkpoint_path).exists():
        client.log_artifact(run_id, str(checkpoint_path), artifact_path="checkpoint")
    run_artifacts.log_encoder(client, run_id, result.model, config, data.test_patches[:2])
    return metrics, train_seconds


def during_training(config: Config) -> list:
    """The registered evaluators that run while the model trains (``online``: every
    ``eval.every`` updates), with ``config``'s settings, those that are on."""
    from mae_core.registry import evaluators

    chosen = [evaluators.get(name).evaluator_class.from_config(config) for name in evaluators.names()
              if evaluators.get(name).during_training]
    return [evaluator for evaluator in chosen if evaluator.active()]


def _online_evaluation(client: MlflowClient, run_id: str, config: Config,
                       data: PatchData) -> Callable[[int, object], None] | None:
    """``eval.every > 0``: the training loop's ``on_evaluate``, which logs the online metrics
    (:mod:`evaluation.online`) at step = update, skipping a step a resumed run logged already."""
    if config.eval.every <= 0:
        return None
    measures = [evaluator.during(config, data) for evaluator in during_training(config)]
    already = tracking.logged_steps(client, run_id, ONLINE_METRICS[0])

    def on_evaluate(step: int, model) -> None:
        if step not in already:
            metrics = {name: value for measure in measures for name, value in measure(model).items()}
            tracking.log_metrics(client, run_id, metrics, step, int(time.time() * 1000))

    return on_evaluate


def _copy_online_histories(client: MlflowClient, source_run_id: str, run_id: str, up_to: int) -> None:
    """A reusing trial's online histories: the computing trial's up to update ``up_to`` (a longer
    run's, for a prefix), which read the same encoder at the same steps with the same online
    settings (they are part of the pretraining key)."""
    for key in ONLINE_METRICS:
        already = tracking.logged_steps(client, run_id, key)
        for point in client.get_metric_history(source_run_id, key):
            if point.step <= up_to and point.step not in already:
                tracking.log_metrics(client, run_id, {key: point.value}, point.step, point.timestamp)


def _log_prefix_checkpoint(client: MlflowClient, run_id: str, config: Config, found: shared.SharedEncoder) -> None:
    """The model a run read at an update of a longer run, as its ``checkpoint/checkpoint.pt``
    artifact (weights, config, step and history; no optimiser state: it is not for resuming), so
    ``mae-study evaluate`` reads this run's encoder, not the longer run's final one."""
    with tempfile.TemporaryDirectory(prefix="mae-prefix-") as folder:
        path = Path(folder) / "checkpoint.pt"
        torch.save({"step": config.steps, "model": found.model, "config": config.resolved(),
                    "history": found.history, "extra": {"mlflow_run_id": run_id, "read_from_run": found.run_id}},
                   path)
        client.log_artifact(run_id, str(path), artifact_path="checkpoint")


def pretraining_decided(shard: Shard, config: Config, trains: bool = False) -> bool:
    """Whether a data-parallel trial trains its encoder, as its rank 0 decided on claiming its
    pretraining key (:mod:`studies.pretrained`): rank 0 passes ``trains``, every other rank waits
    here for it (a reused encoder leaves them nothing to do). One process: ``trains``."""
    if not shard.active:
        return trains
    device = torch.device(shard.device) if shard.device is not None else resolve_device(config.device)
    return shard.any(trains and shard.rank == 0, device)


def _checkpoint_step(checkpoint_path: Path) -> int:
    """The update a trial's newest readable checkpoint holds (0 if none is readable)."""
    state, _ = load_latest_checkpoint(Path(checkpoint_path))
    return int(state["step"]) if state is not None else 0


def _shared_pretraining(client: MlflowClient, run_id: str, config: Config, data: PatchData,
                        pretrained: shared.PretrainedCache, train_own, on_log,
                        checkpoint_path: Path | None, shard: Shard = Shard()) -> tuple[TrainResult, float]:
    """Train the encoder of this trial's pretraining key and keep it for the study's other
    trials, or evaluate the one a trial kept (its ``train_loss`` history logged through
    ``on_log``, its training seconds returned). Tags the run ``pretraining: computed|reused KEY``,
    and a reusing run ``pretraining_run: <the computing run>``. Rank 0 of a data-parallel trial
    tells the other ranks whether they train (:func:`pretraining_decided`)."""
    key = pretrained.key(config, data)
    own_work = checkpoint_path is not None and any(  # this trial was training this key: it finishes
        path.exists() for path in (Path(checkpoint_path), Path(f"{checkpoint_path}.prev")))
    if not own_work and shared.read_from_longer(config, pretrained.lengths):
        pretrained.await_reservation(key)
    with pretrained.claim(key, own_work=own_work) as claim:
        pretraining_decided(shard, config, trains=claim.found is None)
        if claim.found is None:
            tracking.set_tags(client, run_id, {shared.TAG: f"computed {key}"})
            resumes_at = _checkpoint_step(checkpoint_path) if own_work else 0
            with shared.reserved_prefixes(pretrained, config, data, resumes_at) as reserved:
                started = time.perf_counter()

                def keep_prefix(step: int, model, history: list[tuple[int, float]]) -> None:
                    # the shorter trial's model: this run at update `step` (its seconds so far)
                    reserved.pop(step).keep(model, history, run_id, time.perf_counter() - started, config.steps)

                result, train_seconds = train_own(tuple(reserved), keep_prefix)
            claim.keep(result.model, result.history, run_id, train_seconds)
    if claim.found is None:
        return result, train_seconds
    found = claim.found
    tracking.set_tags(client, run_id, {shared.TAG: f"reused {key}", shared.SOURCE_TAG: found.run_id,
                                       **({shared.SOURCE_STEPS_TAG: found.source_steps}
                                          if found.source_steps is not None else {})})
    for step, loss in found.history:
        on_log(step, {"train_loss": loss})
    if config.eval.every > 0:
        _copy_online_histories(client, found.run_id, run_id, up_to=config.steps)
    if found.source_steps is not None:  # not the computing run's final model: this run keeps its own
        _log_prefix_checkpoint(client, run_id, config, found)
    model = found.load_into(build_model(config)).to(resolve_device(config.device)).eval()
    return TrainResult(model=model, steps=config.steps, history=list(found.history)), found.train_seconds
