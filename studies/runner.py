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
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ray.tune import Callback

from evaluation.baselines import BaselineCache
from mae_core.config import Config
from mae_core.errors import UserError
from mae_core.train import prepare_data

from . import lifecycle, tracking
from .environment import quiet_libraries
from .lifecycle import RayCheckpoints
from .search import SearchSpec
from .study import Study, cell_id, trial_keys, without_keys, zip_space_key
from .summary import log_study_summary

STATE_FILE = "study.json"  # in the study's output folder: parent run id, Ray folder, grid
BASELINES_DIR = "baselines"  # in the study's output folder: one JSON per shared set (evaluation.baselines)


class StudySetupError(UserError):
    """Bad input found before Ray starts (one line)."""


class StudyInterrupted(Exception):
    """SIGINT/SIGTERM stopped the study; ``state`` is what was saved (None: nothing recorded yet)."""

    def __init__(self, state: dict[str, Any] | None, reason: str):
        self.state, self.reason = state, reason
        super().__init__(f"interrupted by {reason}")


@dataclass(frozen=True)
class RunOptions:
    out_dir: Path  # the study's folder (absolute)
    tracking_uri: str
    experiment: str = tracking.DEFAULT_EXPERIMENT
    smoke: bool = False
    resume: bool = False
    address: str | None = None  # None: a local Ray on this machine's CPUs
    max_concurrent: int | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    # >1: each trial is a Ray Train TorchTrainer (DDP) on this many workers, each with
    # cpus_per_trial CPUs and gpus_per_trial GPUs; batch_size stays the global batch (studies.ddp)
    workers_per_trial: int = 1
    max_failures: int = 2  # Ray retries of a crashed trial (a diverging trial is not retried)
    scheduler: str = "fifo"  # fifo: every cell runs to the end; asha: stop poor trials early (exploration only)
    command: str | None = None  # the command line that started the study, for its report


@dataclass(frozen=True)
class StudyPlan:
    study: Study
    base: dict[str, Any]  # keys every trial shares
    axes: dict[str, list[Any]]  # the grid_search axes, seeds included as "seed"
    cells: list[dict[str, Any]]
    reference: dict[str, Any]  # the reference cell of this grid (Study.reference_cell)
    zipped: tuple[dict[str, list[Any]], ...] = ()  # groups of keys that vary together (Study.grid_zipped)
    search: SearchSpec | None = None  # keys sampled for every arm of the grid (studies.search)
    # --until-decided: the sequential plan (analysis.sequential.Plan.as_dict), named on the
    # parent run before the first look
    sequential: dict[str, Any] | None = None
    batch: bool = False  # a batch of seeds added to a study that ran (studies.seeds): no summary yet

    @property
    def num_trials(self) -> int:
        """Trials Ray runs: every cell, times the samples of a search."""
        return len(self.cells) * (self.search.samples if self.search is not None else 1)

    @property
    def varied(self) -> list[str]:
        """Every key a trial's cell varies (axes, zipped keys, searched keys), seed last."""
        keys = [a for a in self.axes if a != "seed"] + [k for group in self.zipped for k in group]
        return keys + list(self.search.space if self.search else ()) + ["seed"]


def plan_study(study: Study, *, smoke: bool, overrides: dict[str, Any],
               search: SearchSpec | None = None) -> StudyPlan:
    """Every cell validated and its data loadable, or a ConfigError/DataError/NormDomainError;
    with ``search``, its ranges checked with every arm (a searched key is no longer an axis)."""
    overrides = dict(overrides)  # the caller's dict is left as it was
    seeds = overrides.pop("seeds", None)
    seed_values = tuple(int(s) for s in str(seeds).split(",")) if seeds is not None else None
    if search is not None:
        study = without_keys(study, set(search.space))
    cells = study.cells(smoke=smoke, overrides=overrides, seeds=seed_values)
    configs = [Config(**cell) for cell in cells]
    if search is not None:
        from .search import check_space

        configs += check_space(search, cells)
    check_data(configs)
    axes = study.grid_axes(smoke, overrides)
    zipped = study.grid_zipped(smoke, overrides)
    axes["seed"] = sorted({cell["seed"] for cell in cells})
    varied = set(axes).union(*zipped)
    base = {k: v for k, v in cells[0].items() if k not in varied}
    return StudyPlan(study=study, base=base, axes=axes, cells=cells,
                     reference=study.reference_cell(smoke, overrides), zipped=zipped, search=search)


def check_data(configs: list[Config]) -> None:
    """Load each distinct dataset the configs name once: data problems surface here, not
    inside a Ray worker."""
    checked: set[tuple] = set()
    for config in configs:
        key = (config.dataset, config.seed, config.target, config.train_limit, config.test_limit,
               config.resolved_patch_size)
        if key not in checked:
            prepare_data(config)
            checked.add(key)


def tune_space(plan: StudyPlan) -> tuple[dict[str, Any], Any, int]:
    """(param_space, search_alg, num_samples) of the Tuner: a grid_search per axis and zipped
    group (a row of its keys per value), or a search over that grid (:func:`studies.search.tune_search`)."""
    from ray import tune

    space = {axis: tune.grid_search(values) for axis, values in plan.axes.items()}
    for group in plan.zipped:
        space[zip_space_key(group)] = tune.grid_search([dict(zip(group, row)) for row in zip(*group.values())])
    if plan.search is None:
        return space, None, 1
    from .search import tune_search

    grid_keys = [a for a in plan.axes if a != "seed"] + [k for group in plan.zipped for k in group]
    arms = list({cell_id(a): a for a in ({k: c[k] for k in grid_keys} for c in plan.cells)}.values())
    return tune_search(plan.search, space, arms, plan.axes["seed"])


def plan_tags(plan: StudyPlan) -> dict[str, str]:
    """The parent run's tags for zipped groups and a search (none for a plain grid)."""
    tags = {}
    if plan.zipped:
        tags["zip"] = json.dumps(plan.zipped, default=str)
    if plan.search is not None:
        tags["search"] = plan.search.tag()
    if plan.study.claims:  # compact: the report completes them against the grid that ran
        tags["claims"] = json.dumps(plan.study.claims, default=str, separators=(",", ":"))
    if plan.sequential is not None:
        tags["sequential_plan"] = json.dumps(plan.sequential, separators=(",", ":"))
    return tags


# --------------------------------------------------------------------------- preflight


def check_address(address: str | None, timeout_s: float = 3.0) -> None:
    """Fail within seconds on an address nothing listens at (``ray.init`` can hang instead)."""
    if address in (None, "auto", "local"):
        return
    parsed = urlparse(address if "://" in address else f"ray://{address}")
    if not parsed.hostname or not parsed.port:
        raise StudySetupError(f"--address {address}: expected auto, host:port or ray://host:port")
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s):
            pass
    except OSError as error:
        raise StudySetupError(f"--address {address}: no Ray cluster reachable ({error.strerror or error})") from None


def available_resources(address: str | None) -> dict[str, float] | None:
    """CPUs and GPUs the study's Ray offers: the running Ray's, or for a local Ray still to be
    started this machine's (its CPUs and CUDA devices); None for a cluster not yet joined."""
    import ray

    if ray.is_initialized():
        return {name: float(ray.cluster_resources().get(name, 0.0)) for name in ("CPU", "GPU")}
    if address in (None, "local"):
        import torch

        return {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
    return None


def check_resources(options: RunOptions, available: dict[str, float], where: str) -> None:
    """Refuse a per-trial request no node could ever meet: Ray would wait for it forever."""
    for name, asked in (("CPU", options.cpus_per_trial), ("GPU", options.gpus_per_trial)):
        flag = f"--{name.lower()}s-per-trial {asked:g}"
        if options.workers_per_trial > 1:  # every worker of a trial asks for that share
            flag, asked = f"{flag} × --workers-per-trial {options.workers_per_trial}", asked * options.workers_per_trial
        if asked < 0 or (name == "CPU" and asked == 0):
            raise StudySetupError(f"{flag}: must be {'positive' if name == 'CPU' else 'at least 0'}")
        if asked > available.get(name, 0.0):
            raise StudySetupError(f"{flag}: each trial asks for {asked:g} {name}(s) but {where} has "
                                  f"{available.get(name, 0.0):g}")


def default_gpus_per_trial(num_trials: int, cpus_per_trial: float, address: str | None) -> float:
    """A GPU's share per trial when the user named none: 0 without a local CUDA device; else the
    trials that can run at once (by CPUs, at most 8: small models share a GPU well) split one GPU."""
    import torch

    if address not in (None, "local") or not torch.cuda.is_available():
        return 0.0
    at_once = max(1, min(8, num_trials, int((os.cpu_count() or 1) // max(cpus_per_trial, 1e-9))))
    return 1.0 / at_once


def load_state(out_dir: Path) -> dict[str, Any] | None:
    path = out_dir / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None


def save_state(out_dir: Path, state: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, default=str))
    os.replace(tmp, out_dir / STATE_FILE)


def check_resume(plan: StudyPlan, options: RunOptions) -> dict[str, Any] | None:
    """The saved state to resume, or None for a fresh study; refuses a changed grid, and refuses
    to start afresh over an interrupted study (its state would be overwritten, and with it the
    only way to resume it)."""
    state = load_state(options.out_dir)
    if not options.resume:
        if state is not None and not state.get("complete", False):
            name = f" ({state['name']})" if state.get("name") else ""
            raise StudySetupError(f"{options.out_dir} holds an unfinished study{name}: pass --resume "
                                  "to continue it, or --out FOLDER to start anew")
        return None
    from ray.tune import Tuner

    if state is None:
        raise StudySetupError(f"--resume: no study to resume in {options.out_dir}")
    if sorted(cell_id(c) for c in plan.cells) != sorted(state["cells"]):
        raise StudySetupError(
            f"--resume: the grid differs from the interrupted study in {options.out_dir} "
            "(same study, overrides and --smoke are required); run without --resume to start anew"
        )
    searched = plan.search.describe() if plan.search is not None else None
    if state.get("search") != searched:
        raise StudySetupError(f"--resume: the search differs from the interrupted study in {options.out_dir} "
                              "(same --search, --samples, --metric and ranges are required)")
    # Interrupted before Ray wrote anything: the grid starts in Ray afresh, under the same
    # parent run (cells whose child run already FINISHED are not trained again).
    state["ray_restorable"] = Tuner.can_restore(state["ray_path"])
    return state


# --------------------------------------------------------------------------------- trial


def trainable(trial_config: dict[str, Any], *, base: dict[str, Any], study_name: str,
              tracking_uri: str, experiment: str, parent_run_id: str, search: bool = False,
              baseline_dir: str | None = None, workers: dict[str, Any] | None = None,
              plugins: list[str] | None = None) -> None:
    """One Ray Tune trial: a grid cell trained, evaluated and logged to its own MLflow run.
    In a search, a trial's run is found by its Ray trial id as well (two samples may draw the
    same values, and each is its own trial). Baselines are shared through ``baseline_dir``
    (:mod:`evaluation.baselines`); where a trial's varied keys include an ``eval.*`` key, so do
    trained encoders, in the ``pretrained/`` folder beside it (:mod:`studies.pretrained`).
    ``workers`` (``workers``, ``cpus``, ``gpus``, ``folder``): the trial trains on that many Ray
    Train workers (:mod:`studies.ddp`), its checkpoint kept under ``folder``. ``plugins``: the
    driver's (:func:`mae_core.plugins.loaded_specs`), imported here before the config is built;
    None reads them from ``MAE_STUDY_PLUGINS``."""
    import ray
    import torch
    from mlflow.tracking import MlflowClient
    from ray import tune

    from mae_core.plugins import load_from_environment, load_plugins
    from mae_core.train import NonFiniteError

    from .pretrained import PRETRAINED_DIR, PretrainedCache
    from .trial import run_trial, trial_run_name

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
    tags = {"study": study_name, "cell_id": cell, "ray_node_id": context.get_node_id(),
            "ray_gpu_ids": ",".join(context.get_accelerator_ids().get("GPU", [])),
            "ray_trial_id": tune.get_context().get_trial_id(), "ray_worker_pid": str(os.getpid())}
    if workers is not None:
        from .ddp import CHECKPOINTS_DIR, train_on_workers

        folder = Path(workers["folder"])
        loop = {"keys": keys, "tracking_uri": tracking_uri, "experiment": experiment, "run_id": run_id,
                "run_name": trial_run_name(config), "parent_run_id": parent_run_id, "tags": tags,
                # one folder per study run and cell: a fresh study in the same --out never resumes another's
                "checkpoint_path": str(folder / CHECKPOINTS_DIR / parent_run_id / cell / "checkpoint.pt"),
                "baseline_dir": baseline_dir, "plugins": plugins}
        tune.report(train_on_workers(loop, workers=workers["workers"], cpus_per_worker=workers["cpus"],
                                     gpus_per_worker=workers["gpus"], storage=folder / "ray-train"))
        return
    checkpoints = RayCheckpoints()
    checkpoints.restore()
    last = {"train_loss": float("nan")}

    def on_checkpoint(step: int, path: Path) -> None:
        if step < config.steps:  # the final report below carries the final checkpoint's metrics
            checkpoints.report({"step": step, "train_loss": last["train_loss"]})

    try:
        outcome = run_trial(config, prepare_data(config), tracking_uri=tracking_uri, experiment=experiment,
                            run_id=run_id, run_name=trial_run_name(config), parent_run_id=parent_run_id,
                            tags=tags, checkpoint_path=checkpoints.path,
                            on_progress=lambda step, metrics: last.update(metrics), on_checkpoint=on_checkpoint,
                            baselines=BaselineCache(Path(baseline_dir)) if baseline_dir else None,
                            # cells that differ only in eval.* keys train one encoder per seed
                            pretrained=(PretrainedCache(Path(baseline_dir).parent / PRETRAINED_DIR)
                                        if baseline_dir and any(k.startswith("eval.") for k in trial_keys(trial_config))
                                        else None))
    except NonFiniteError as error:
        # Fails alone, with its reason in MLflow (run_trial marked it); Ray must not retry it.
        tune.report({"step": error.step, "diverged": 1.0, "failure_reason": str(error),
                     "train_loss": float("inf")})
        return
    finally:
        checkpoints.close()
    tune.report({"step": config.steps, "diverged": 0.0, "train_loss": last["train_loss"], **outcome.metrics})


# -------------------------------------------------------------------------------- driver


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
    :mod:`studies.seeds`) adds trials under the same parent run, in a Ray experiment of its own.

    Raises :class:`StudyInterrupted` after SIGINT/SIGTERM (``interruption`` names the signal),
    with the parent run and every unfinished child run KILLED and the state left incomplete.
    """
    from mlflow.tracking import MlflowClient

    state = None
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
        if extend is not None:
            save_state(options.out_dir, state)  # the batch is recorded before Ray starts: --resume finds it
        STOP_REQUESTED.clear()
        results = _fit(plan, options, state, progress, interruption)
        interrupted = STOP_REQUESTED.is_set()
    except KeyboardInterrupt:
        interrupted = True
    reason = interruption.reason if interruption is not None else "SIGINT"
    if interrupted:
        if state is not None:
            tracking.mark_killed(MlflowClient(options.tracking_uri), state["parent_run_id"], reason)
            state.update(complete=False, interrupted=reason)
            save_state(options.out_dir, state)
        raise StudyInterrupted(state, reason)
    errored = sum(1 for r in results if r.error is not None)
    diverged = sum(1 for r in results if (r.metrics or {}).get("diverged") == 1.0)
    if not plan.batch:  # a batch's driver summarises the whole study once it has run
        log_study_summary(client, state["parent_run_id"], experiment_id, plan.cells,
                          [axis for axis in plan.axes if axis != "seed"], plan.reference)
    client.set_terminated(state["parent_run_id"], "FAILED" if errored else "FINISHED")
    state.pop("interrupted", None)
    state.update(trials=len(results), errored=errored, diverged=diverged, complete=errored == 0)
    save_state(options.out_dir, state)  # complete: a fresh run may now replace it
    return state


def _create_parent(client, experiment_id: str, plan: StudyPlan, options: RunOptions) -> dict[str, Any]:
    """The study's parent MLflow run and its saved state (written before Ray starts)."""
    name = f"{plan.study.name}{'-smoke' if options.smoke else ''}-{time.strftime('%Y%m%d-%H%M%S')}"
    parent = tracking.create_run(client, experiment_id, name, tags={
        "study": plan.study.name, "study_axes": json.dumps(plan.varied[:-1]),
        "grid": json.dumps(plan.axes, default=str), "smoke": str(options.smoke),
        "ray_address": options.address or "local", "paper": plan.study.paper,
        # the row every other row is compared with; a report reads it from here (MLflow alone)
        "reference": json.dumps(plan.reference, default=str), **plan_tags(plan),
        # provenance a report states: the exact command and the driver's machine
        "machine": tracking.machine(), **({"command": options.command} if options.command else {}),
        "workers_per_trial": str(options.workers_per_trial),
    })
    state = {"study": plan.study.name, "parent_run_id": parent, "name": name,
             "ray_path": str(options.out_dir / "ray" / name),
             "cells": sorted(cell_id(c) for c in plan.cells), "axes": plan.axes, "complete": False,
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
    )
    if options.workers_per_trial > 1:  # the trial only waits on its trainer, whose workers hold the resources
        fn = tune.with_resources(fn, {"cpu": 0, "memory": 1})  # (Ray refuses an empty request: 1 byte)
    else:
        fn = tune.with_resources(fn, {"cpu": options.cpus_per_trial, "gpu": options.gpus_per_trial})
    callbacks = [RayStopWatch(), *([progress] if progress is not None else [])]
    # Trials checkpoint every few seconds in smoke mode; Ray's advice to checkpoint less is noise here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    started = start_ray(options.address)
    if interruption is not None:
        interruption.forward_sigterm()
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
