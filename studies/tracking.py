"""MLflow plumbing: the default store, experiments, runs reopened by id, the fluent active run.

The default store is an SQLite file in the command's ``--out`` folder, named by *absolute* path
(Ray trials run in their own folders and would otherwise each get their own ``mlflow.db``), with
the artifacts beside it in ``mlartifacts/``. Experiments get an absolute artifact location for
the same reason. Every run carries MLflow's standard source tags (commit, entry point, source
type, user), so the MLflow UI shows them where its users look.

A trial's run is MLflow's *fluent* active run while the trial works (:func:`fluent_run`): created
with ``mlflow.start_run(parent_run_id=...)`` or reopened with ``mlflow.start_run(run_id=...)``,
so ``mlflow.log_input`` and ``mlflow.pytorch.log_model`` find it, and with system metrics
(``system/*``: CPU, memory, disk, network; GPU where pynvml sees one) sampled beside it.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import platform
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag, SourceType
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import (
    MLFLOW_GIT_COMMIT,
    MLFLOW_PARENT_RUN_ID,
    MLFLOW_RUN_NAME,
    MLFLOW_SOURCE_NAME,
    MLFLOW_SOURCE_TYPE,
    MLFLOW_USER,
)

DEFAULT_EXPERIMENT = "mae-study"
SOURCE_NAME = "mae-study"  # the entry point (the console script), whether train, run or a Ray worker
MAX_PARAM_LENGTH = 6000  # MLflow 3's limit on a param value
STORE_FILE = "mlflow.db"  # the default store in the command's --out folder
ARTIFACTS_FOLDER = "mlartifacts"  # beside it
# Seconds between system-metric samples: a point every few seconds shows a trial's load without
# loading SQLite (MLflow's own default is 10 s; MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL wins).
SYSTEM_METRICS_INTERVAL_S = 5.0


def default_tracking_uri(folder: Path | None = None) -> str:
    """``sqlite:///<abs>/mlflow.db`` in ``folder`` (default: the working directory)."""
    return f"sqlite:///{(Path(folder or Path.cwd()) / STORE_FILE).resolve()}"


def sqlite_path(tracking_uri: str) -> Path | None:
    """The file an ``sqlite:///`` URI names; None for any other store."""
    return Path(tracking_uri.removeprefix("sqlite:///")) if tracking_uri.startswith("sqlite:///") else None


def missing_sqlite_store(tracking_uri: str) -> Path | None:
    """The SQLite file ``tracking_uri`` names when it does not exist (reading must not create it)."""
    store = sqlite_path(tracking_uri)
    return store if store is not None and not store.is_file() else None


def unreadable_sqlite_store(tracking_uri: str) -> str | None:
    """Why the SQLite file ``tracking_uri`` names cannot be read as an MLflow store (not a
    database, damaged or truncated, another program's database); None when it can, when it does
    not exist, or for a server. Read-only: a reader never creates or migrates a store."""
    import contextlib
    import sqlite3

    store = sqlite_path(tracking_uri)
    if store is None or not store.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)) as db:
            problems = [row[0] for row in db.execute("PRAGMA quick_check(1)")]
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as error:
        if "locked" in str(error) or "busy" in str(error):  # another command is writing it: not damage
            return None
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    if problems != ["ok"]:
        return f"damaged: {problems[0].splitlines()[0][:120]}"
    if not {"runs", "experiments"} <= tables:
        return "no runs or experiments table: another program's database"
    return None


def default_artifact_root(tracking_uri: str) -> str | None:
    """Beside the SQLite file (``mlartifacts/``), as an absolute path; None for a server."""
    store = sqlite_path(tracking_uri)
    return str(store.parent / ARTIFACTS_FOLDER) if store is not None else None


def git_commit() -> str:
    """The code version of this checkout ("unknown" outside git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def user() -> str:
    """Who ran it, as MLflow itself records it; "unknown" where the system has no user name."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no USER/LOGNAME and no passwd entry (some containers)
        return "unknown"


def machine() -> str:
    """The machine a study's driver ran on, for a report's provenance: OS, CPU model and core
    count, GPU (if CUDA sees one), Python and torch versions. No host name."""
    cpu = platform.processor() or platform.machine()
    try:  # Linux names the model here; platform.processor() is often empty
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    import torch  # the driver has imported it already (the study's data); light here

    gpu = (f"{torch.cuda.device_count()}× {torch.cuda.get_device_name(0)}" if torch.cuda.is_available()
           else "no GPU")
    return (f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({cpu}), {gpu}; "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def source_tags() -> dict[str, str]:
    """MLflow's standard source tags; the commit only inside a git checkout (no made-up value)."""
    tags = {MLFLOW_SOURCE_NAME: SOURCE_NAME, MLFLOW_SOURCE_TYPE: SourceType.to_string(SourceType.LOCAL),
            MLFLOW_USER: user()}
    commit = git_commit()
    if commit != "unknown":
        tags[MLFLOW_GIT_COMMIT] = commit
    return tags


def ensure_experiment(client: MlflowClient, name: str, tracking_uri: str) -> str:
    """The experiment's id, creating it (with an absolute artifact root) if needed."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    root = default_artifact_root(tracking_uri)
    location = f"{root}/{name}" if root else None
    return client.create_experiment(name, artifact_location=location)


def create_run(client: MlflowClient, experiment_id: str, run_name: str,
               parent_run_id: str | None = None, tags: dict[str, str] | None = None) -> str:
    all_tags = {MLFLOW_RUN_NAME: run_name, **source_tags(), **(tags or {})}
    if parent_run_id:
        all_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
    run = client.create_run(experiment_id, run_name=run_name, tags=all_tags)
    return run.info.run_id


def log_params(client: MlflowClient, run_id: str, params: dict) -> None:
    """Log params once; a reopened run that already has them is left as it is."""
    existing = client.get_run(run_id).data.params
    fresh = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items() if k not in existing]
    for start in range(0, len(fresh), 100):  # MLflow's batch limit for params
        client.log_batch(run_id, params=fresh[start:start + 100])


def log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float], step: int,
                timestamp_ms: int) -> None:
    client.log_batch(run_id, metrics=[Metric(k, float(v), timestamp_ms, step) for k, v in metrics.items()])


def logged_steps(client: MlflowClient, run_id: str, key: str) -> set[int]:
    """Steps already recorded for ``key`` (so a resumed run never logs a step twice)."""
    return {m.step for m in client.get_metric_history(run_id, key)}


def set_tags(client: MlflowClient, run_id: str, tags: dict[str, str]) -> None:
    client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def _child_runs(client: MlflowClient, parent_run_id: str, statuses: tuple[str, ...]) -> list[str]:
    """The ids of ``parent_run_id``'s child runs whose status is one of ``statuses``."""
    parent = client.get_run(parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
    )
    return [child.info.run_id for child in children if child.info.status in statuses]


def _end_killed(client: MlflowClient, run_ids: list[str], reason: str) -> None:
    """End each run KILLED with ``reason`` as its ``interrupted`` tag (a resumed study reopens it)."""
    for run_id in run_ids:
        set_tags(client, run_id, {"interrupted": reason})
        client.set_terminated(run_id, "KILLED")


def mark_killed(client: MlflowClient, parent_run_id: str, reason: str) -> None:
    """End an interrupted study's parent run and every unfinished child as KILLED, with the
    signal as the ``interrupted`` tag (a resumed study reopens them). A child its own worker
    already ended KILLED (Ray stops trials by raising in them) gets the driver's signal too."""
    _end_killed(client, _child_runs(client, parent_run_id, ("RUNNING", "KILLED")) + [parent_run_id], reason)


STOPPED_BY_RAY = "stopped by Ray Tune"


def end_stopped_children(client: MlflowClient, parent_run_id: str) -> list[str]:
    """End as KILLED every child run still RUNNING once Ray Tune's loop has ended by itself.

    Such a run belongs to a trial Ray stopped (a scheduler such as ASHA cutting it at a rung)
    and whose process Ray ended before the trial's own handler could record it; left alone it
    would read RUNNING forever. It gets the ``interrupted`` tag :data:`STOPPED_BY_RAY` (a
    resumed study reopens it like any interrupted run). Returns the runs ended."""
    running = _child_runs(client, parent_run_id, ("RUNNING",))
    _end_killed(client, running, STOPPED_BY_RAY)
    return running


def reopen(client: MlflowClient, run_id: str) -> None:
    """Mark a run RUNNING again; an earlier attempt's ``interrupted`` or ``failure_reason`` tag
    becomes ``resumed_after`` or ``retried_after`` (the run is no longer interrupted or failed,
    but its history says it was)."""
    tags = client.get_run(run_id).data.tags
    for stale, kept in (("interrupted", "resumed_after"), ("failure_reason", "retried_after")):
        if stale in tags:
            set_tags(client, run_id, {kept: tags[stale]})
            client.delete_tag(run_id, stale)
    client.update_run(run_id, status="RUNNING")


CONTINUED_TAG = "continued_on_commits"


def record_continuing_commit(client: MlflowClient, run_id: str) -> None:
    """A driver that continues ``run_id`` (``--resume``, a further look, ``--add-seeds``) from
    another commit than the one that started it adds its commit to the run's
    ``continued_on_commits`` tag (a JSON list, in order), so a report names every commit a
    study's trials ran on. Outside a git checkout nothing is recorded (no made-up value)."""
    commit = git_commit()
    tags = client.get_run(run_id).data.tags
    seen = json.loads(tags.get(CONTINUED_TAG, "[]"))
    if commit == "unknown" or commit == tags.get(MLFLOW_GIT_COMMIT) or commit in seen:
        return
    set_tags(client, run_id, {CONTINUED_TAG: json.dumps([*seen, commit])})


# --------------------------------------------------------------------- the fluent active run


@contextmanager
def fluent_run(tracking_uri: str, *, run_id: str | None = None, experiment_id: str | None = None,
               run_name: str | None = None, parent_run_id: str | None = None,
               tags: dict[str, str] | None = None, system_metrics: bool = True) -> Iterator[str]:
    """MLflow's active run for the block: the run ``run_id`` reopened (``tags`` set on it), or
    a new run in ``experiment_id`` under ``parent_run_id`` with the standard source tags; yields
    its id. The caller (``lifecycle``) gives the run its final status; a block left by an error
    before that ends it KILLED (a signal) or FAILED, so the thread's run stack is always popped.

    Makes ``tracking_uri`` the process's current MLflow URI (fluent calls read it from there).
    """
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    if run_id is not None:
        run = mlflow.start_run(run_id=run_id, tags=tags or None, log_system_metrics=False)
    else:
        run = mlflow.start_run(experiment_id=experiment_id, run_name=run_name, parent_run_id=parent_run_id,
                               tags={**source_tags(), **(tags or {})}, log_system_metrics=False)
    run_id = run.info.run_id
    monitor = SystemMetrics(tracking_uri, run_id) if system_metrics else None
    status = None
    try:
        yield run_id
    except BaseException as error:
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        raise
    finally:
        if monitor is not None:
            monitor.stop()
        current = MlflowClient(tracking_uri).get_run(run_id).info.status
        mlflow.end_run(current if current != "RUNNING" else status or "FINISHED")


class SystemMetrics:
    """MLflow's system-metrics monitor for one run, every :data:`SYSTEM_METRICS_INTERVAL_S`
    seconds, plus one last sample when stopped (MLflow's monitor drops an unfinished interval,
    so a trial shorter than one interval would otherwise show no system metrics at all)."""

    def __init__(self, tracking_uri: str, run_id: str):
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        with _quiet("mlflow.system_metrics"):  # "Started monitoring ..." and the GPU note
            self.monitor = SystemMetricsMonitor(run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                                                resume_logging=True, tracking_uri=tracking_uri)
            self.monitor.start()

    def stop(self) -> None:
        with _quiet("mlflow.system_metrics"):
            self.monitor.finish()
            try:
                self.monitor.collect_metrics()
                self.monitor.publish_metrics(self.monitor.aggregate_metrics())
                self.monitor.mlflow_logger.flush()
            except Exception as error:  # a sample is not worth failing a finished trial for
                logging.getLogger(__name__).debug("last system-metrics sample lost: %s", error)


@contextmanager
def _quiet(logger_name: str, level: int = logging.ERROR) -> Iterator[None]:
    """Raise ``logger_name``'s level for the block (MLflow's INFO and advice lines)."""
    logger = logging.getLogger(logger_name)
    previous = logger.level
    logger.setLevel(max(level, previous))
    try:
        yield
    finally:
        logger.setLevel(previous)
