"""Run a study's grid with Ray Tune; every trial is one MLflow child run of the study's run.

Order of work (each step can fail with a one-line error before the next begins):

1. resolve every cell's config and load its data (bad keys, paths, D_norm refusals);
2. check the output folder, the ``--resume`` state and the Ray address;
3. create the MLflow store, experiment and parent run on the driver (SQLite must not see
   several processes create a schema at once);
4. start or join Ray and run the trials.

A trial checkpoints through ``ray.tune.report``; a retried or resumed trial continues from its
last checkpoint and reopens its own MLflow run (found by the cell's id under the parent run),
so a study ends with exactly one child run per grid cell.

This module is the driver (steps 3 and 4); the plan is :mod:`studies.planning`, the checks
before anything starts :mod:`studies.preflight`, a trial :mod:`studies.trainable`, and the
study's saved state (``study.json``) :mod:`studies.lifecycle`.
"""

import logging
import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any

from ray.tune import Callback

from analysis.registration import CLAIMS_HASH_TAG, COMMIT_TAG
from analysis.study_header import StudyHeader
from mae_core.config import Config

from . import tracking
from .environment import quiet_libraries
from .lifecycle import STATE_FILE, load_state, save_state
from .planning import (BASELINES_DIR, RunOptions, StudyPlan, StudySetupError, cell_settings, plan_study,
                       shared_lengths, tune_space)
from .preflight import available_resources, check_address, check_resources, check_resume, default_gpus_per_trial
from .registration import registration_tags
from .study import cell_id
from .summary import log_study_summary
from .trainable import trainable

# The public names of the study layer, where they have always been imported from.
__all__ = ["BASELINES_DIR", "STATE_FILE", "RunOptions", "StudyInterrupted", "StudyPlan", "StudySetupError",
           "check_resume", "default_gpus_per_trial", "load_state", "plan_study", "run_study", "save_state",
           "trainable", "tune_space"]


class StudyInterrupted(Exception):
    """SIGINT/SIGTERM stopped the study; ``state`` is what was saved (None: nothing recorded yet)."""

    def __init__(self, state: dict[str, Any] | None, reason: str):
        self.state, self.reason = state, reason
        super().__init__(f"interrupted by {reason}")


def start_ray(address: str | None) -> bool:
    """Start or join Ray; False when a Ray session already exists (its owner shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    quiet_libraries()  # in the environment Ray's workers inherit
    if address in (None, "local"):
        # address="local": a new Ray of our own, never a stale cluster another process left
        # behind (joining one is --address auto)
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 configure_logging=False, ignore_reinit_error=True)
    else:
        # Workers do not inherit the driver's environment: pass what the trials need.
        env = {k: os.environ[k] for k in ("RAY_USAGE_STATS_ENABLED", "MLFLOW_TRACKING_URI", "MAE_STUDY_PLUGINS") if k in os.environ}
        ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=False,
                 ignore_reinit_error=True)
    return True


def build_scheduler(name: str, plan: StudyPlan):
    """FIFO (None) for ablations: ASHA stops cells early and unbalances a full factorial, so it
    is only for exploratory sweeps. ASHA compares ``train_loss`` at the trials' checkpoints."""
    if name == "fifo":
        return None
    if name != "asha":
        raise StudySetupError(f"--scheduler {name}: allowed are fifo, asha")
    from ray.tune.schedulers import ASHAScheduler

    max_steps = max(int(Config(**cell).steps) for cell in plan.cells)
    return ASHAScheduler(time_attr="step", metric="train_loss", mode="min", max_t=max(1, max_steps),
                         grace_period=max(1, max_steps // 4), reduction_factor=2)


def run_study(plan: StudyPlan, options: RunOptions, progress=None, interruption=None,
              extend: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run (or resume) the study; returns its state (parent run id, Ray folder, counts).

    ``extend``: the saved state of a study that ran, to which ``plan`` (a batch of new seeds,
    :mod:`studies.seeds_by_need`) adds trials under the same parent run, in a Ray experiment of its own.

    Raises :class:`StudyInterrupted` after SIGINT/SIGTERM (``interruption`` names the signal),
    with the parent run and every unfinished child run KILLED and the state left incomplete.
    """
    from mlflow.tracking import MlflowClient

    state = extend  # a batch's study is recorded already: a signal from here on ends its parent KILLED
    by_ray_sigterm = False
    try:
        check_address(options.address)
        available = available_resources(options.address)
        if available is not None:
            check_resources(options, available, "this machine" if options.address in (None, "local")
                            else f"the cluster at {options.address}")
        state = extend if extend is not None else check_resume(plan, options)
        client = MlflowClient(options.tracking_uri)  # creates the store: only after the checks
        experiment_id = tracking.ensure_experiment(client, options.experiment, options.tracking_uri)
        if state is None:
            state = _create_parent(client, experiment_id, plan, options)
        else:
            tracking.reopen(client, state["parent_run_id"])
            tracking.record_continuing_commit(client, state["parent_run_id"])
        if extend is not None:
            save_state(options.out_dir, state)  # the batch is recorded before Ray starts: --resume finds it
        STOP_REQUESTED.clear()
        results = _fit(plan, options, state, progress, interruption)
        if not (STOP_REQUESTED.is_set() or (interruption is not None and interruption.requested())):
            return _finish(client, experiment_id, plan, options, state, results)
    except KeyboardInterrupt:
        pass  # a signal outside Ray Tune's loop, or in the end's bookkeeping: the run is interrupted all the same
    except SystemExit as stop:
        if stop.code != signal.SIGTERM:
            raise
        # ray.init exits the driver on SIGTERM while it starts Ray (its own handler): an interruption
        by_ray_sigterm = True
        if interruption is not None:
            interruption.signal_name = interruption.signal_name or "SIGTERM"
    reason = interruption.reason if interruption is not None else "SIGTERM" if by_ray_sigterm else "SIGINT"
    if state is not None:
        tracking.mark_killed(MlflowClient(options.tracking_uri), state["parent_run_id"], reason)
        state.update(complete=False, interrupted=reason)
        save_state(options.out_dir, state)
    raise StudyInterrupted(state, reason)


def _finish(client, experiment_id: str, plan: StudyPlan, options: RunOptions, state: dict[str, Any],
            results) -> dict[str, Any]:
    """A study (or batch) whose trials all ran: counts, summary, the parent's end, ``complete``."""
    errored = sum(1 for r in results if r.error is not None)
    diverged = sum(1 for r in results if (r.metrics or {}).get("diverged") == 1.0)
    tracking.end_stopped_children(client, state["parent_run_id"])  # e.g. ASHA's stopped trials
    if not plan.batch:  # a batch's driver summarises the whole study once it has run
        log_study_summary(client, state["parent_run_id"], experiment_id, plan.cells,
                          [axis for axis in plan.axes if axis != "seed"], plan.reference)
    client.set_terminated(state["parent_run_id"], "FAILED" if errored else "FINISHED")
    state.pop("interrupted", None)
    state.update(trials=len(results), errored=errored, diverged=diverged, complete=errored == 0)
    save_state(options.out_dir, state)  # complete: a fresh run may now replace it
    return state


def study_header(plan: StudyPlan, options: RunOptions) -> StudyHeader:
    """The header a study's parent run is tagged with when it starts (:mod:`analysis.study_header`):
    what runs, the row every other row is compared with (a report reads it from MLflow alone),
    the exact command and the driver's machine, what each trial asked Ray for (a share of a GPU
    packs trials on it; issue 36), and the pre-registration (the claims block's hash and the
    study file's commit, :mod:`analysis.registration`)."""
    registered = registration_tags(plan.study)
    return StudyHeader(
        study=plan.study.name, smoke=plan.study.is_smoke, paper=plan.study.paper,
        study_axes=plan.varied[:-1], grid=plan.axes, reference=plan.reference, zip=list(plan.zipped),
        search=plan.search.describe() if plan.search is not None else None, claims=list(plan.study.claims),
        sequential_plan=plan.sequential, claims_sha256=registered[CLAIMS_HASH_TAG],
        study_file_commit=registered[COMMIT_TAG], ray_address=options.address or "local",
        machine=tracking.machine(), command=options.command or None,
        workers_per_trial=options.workers_per_trial, gpus_per_trial=options.gpus_per_trial,
        trials_per_gpu=options.trials_per_gpu)


def _create_parent(client, experiment_id: str, plan: StudyPlan, options: RunOptions) -> dict[str, Any]:
    """The study's parent MLflow run and its saved state (written before Ray starts)."""
    name = f"{plan.study.name}{'-smoke' if plan.study.is_smoke else ''}-{time.strftime('%Y%m%d-%H%M%S')}"
    parent = tracking.create_run(client, experiment_id, name, tags=study_header(plan, options).to_tags())
    state = {"study": plan.study.name, "parent_run_id": parent, "name": name,
             "ray_path": str(options.out_dir / "ray" / name),
             "cells": sorted(cell_id(c) for c in plan.cells), "settings": cell_settings(plan.cells),
             "axes": plan.axes, "complete": False,
             "search": plan.search.describe() if plan.search is not None else None}
    save_state(options.out_dir, state)
    return state


def _fit(plan: StudyPlan, options: RunOptions, state: dict[str, Any], progress, interruption=None):
    """Ray Tune over the grid (restored from its saved state on ``--resume``) -> ResultGrid.

    On SIGINT Ray Tune stops its loop, saves its state and returns the unfinished trials as
    they are; the caller tells that from a finished grid by the trials' statuses.
    """
    from ray import tune

    from mae_core.plugins import loaded_specs

    fn = tune.with_parameters(
        trainable, base=plan.base, study_name=plan.study.name, tracking_uri=options.tracking_uri,
        experiment=options.experiment, parent_run_id=state["parent_run_id"], search=plan.search is not None,
        # On a cluster another node cannot see this folder: each trial then computes its own.
        baseline_dir=str(options.out_dir / BASELINES_DIR) if options.address in (None, "local") else None,
        workers=({"workers": options.workers_per_trial, "cpus": options.cpus_per_trial,
                  "gpus": options.gpus_per_trial, "folder": str(options.out_dir)}
                 if options.workers_per_trial > 1 else None),
        plugins=loaded_specs(),  # the trial processes import what the driver did
        # a shorter length's model read from a longer run (the trainable shares only where
        # baseline_dir is set and a trial is one process, as it does encoders across eval.* cells)
        lengths=shared_lengths(plan),
    )
    if options.workers_per_trial > 1:  # the trial only waits on its trainer, whose workers hold the resources
        fn = tune.with_resources(fn, {"cpu": 0, "memory": 1})  # (Ray refuses an empty request: 1 byte)
    else:
        fn = tune.with_resources(fn, {"cpu": options.cpus_per_trial, "gpu": options.gpus_per_trial})
    callbacks = [RayStopWatch(), *([progress] if progress is not None else [])]
    # Trials checkpoint every few seconds in smoke mode; Ray's advice to checkpoint less is noise here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    handlers = _signal_handlers()  # Ray and Ray Tune replace them and leave theirs behind
    started = start_ray(options.address)
    if interruption is not None:
        interruption.forward_sigterm()
        if interruption.requested():  # a signal whose KeyboardInterrupt Ray's start-up swallowed
            raise KeyboardInterrupt(interruption.reason)
    if started and options.address not in (None, "local"):  # a cluster joined just now
        _check_cluster(options, state)
    try:
        with _quiet_ray_interrupt_hints():
            if options.resume and state.get("ray_restorable", True):
                tuner = tune.Tuner.restore(state["ray_path"], fn, resume_unfinished=True, resume_errored=True)
            else:
                param_space, search_alg, num_samples = tune_space(plan)
                tuner = tune.Tuner(
                    fn,
                    param_space=param_space,
                    # reuse_actors: a trial process imports torch, MLflow and scikit-learn once, not per trial
                    tune_config=tune.TuneConfig(max_concurrent_trials=_max_concurrent(options), reuse_actors=True,
                                                scheduler=build_scheduler(options.scheduler, plan),
                                                search_alg=search_alg, num_samples=num_samples),
                    run_config=tune.RunConfig(
                        name=state["name"], storage_path=str(options.out_dir / "ray"),
                        failure_config=tune.FailureConfig(max_failures=options.max_failures),
                        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                        callbacks=callbacks, verbose=0,
                    ),
                )
            return tuner.fit()
    finally:
        if started:
            import ray

            ray.shutdown()
        _signal_handlers(handlers)


def _signal_handlers(restore: dict | None = None) -> dict:
    """The SIGINT and SIGTERM handlers (set to ``restore`` first when given). After a fit Ray
    Tune's handler would only note a signal, so one between a sequential run's looks would be
    lost: the caller's handlers come back once Ray Tune is done."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    for signum, handler in (restore or {}).items():
        signal.signal(signum, handler)
    return {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}


def _max_concurrent(options: RunOptions) -> int | None:
    """``--max-concurrent``; with several workers per trial, by default as many trials as the
    cluster's CPUs (and GPUs) hold whole trainers: a trial waiting on its trainer holds nothing."""
    if options.max_concurrent is not None or options.workers_per_trial <= 1:
        return options.max_concurrent
    import ray

    total = ray.cluster_resources()
    fits = [total.get("CPU", 0.0) / (options.workers_per_trial * options.cpus_per_trial)]
    if options.gpus_per_trial > 0:
        fits.append(total.get("GPU", 0.0) / (options.workers_per_trial * options.gpus_per_trial))
    return max(1, int(min(fits)))


# Set when Ray Tune's loop stopped on a signal. Ray then stops every trial, and they read as
# TERMINATED like finished ones, so the driver needs its own record of why the loop ended.
STOP_REQUESTED = threading.Event()


class RayStopWatch(Callback):
    """Notes in :data:`STOP_REQUESTED` that Ray Tune's SIGINT handler (installed by ``fit``
    before callbacks are set up) was called, then lets it do its graceful stop."""

    def setup(self, **info):
        ray_handler = signal.getsignal(signal.SIGINT)

        def noting(signum, frame):
            STOP_REQUESTED.set()
            if callable(ray_handler):
                ray_handler(signum, frame)
            else:
                raise KeyboardInterrupt

        signal.signal(signal.SIGINT, noting)


def _check_cluster(options: RunOptions, state: dict[str, Any]) -> None:
    """The resource check for a cluster, possible only once joined: on failure the study never
    started, so its parent run ends FAILED and its saved state is removed."""
    import ray

    try:
        check_resources(options, available_resources(options.address), f"the cluster at {options.address}")
    except StudySetupError as error:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(options.tracking_uri)
        tracking.set_tags(client, state["parent_run_id"], {"failure_reason": str(error)})
        client.set_terminated(state["parent_run_id"], "FAILED")
        (options.out_dir / STATE_FILE).unlink(missing_ok=True)
        ray.shutdown()
        raise


class _DropRayInterruptHints(logging.Filter):
    """Ray Tune's advice after Ctrl-C names ``Tuner.restore``; ours (``--resume``) replaces it.
    Its list of trials without metrics after an interruption (one FileNotFoundError line per
    trial that had not started) says nothing the progress line and ``study.json`` do not."""

    HINTS = ("Tuner.restore", "Stop signal received", "Trials did not complete", "Experiment has been interrupted",
             "Failed to fetch metrics for")
    LOGGERS = ("ray.tune.tune", "ray.tune.analysis.experiment_analysis")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(hint in message for hint in self.HINTS)


@contextmanager
def _quiet_ray_interrupt_hints():
    hints = _DropRayInterruptHints()
    loggers = [logging.getLogger(name) for name in _DropRayInterruptHints.LOGGERS]
    for logger in loggers:
        logger.addFilter(hints)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(hints)
