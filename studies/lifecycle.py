"""A trial's MLflow run from birth to end: which run it is, fresh or resumed, how it ended.

* identity: a ``train`` run is found through the run id its checkpoint carries; a study's
  trial through its cell id under the study's parent run; otherwise a new run is created
  (:func:`opened`: MLflow's fluent ``start_run`` with ``parent_run_id``, or by ``run_id``);
* fresh or resume: :func:`checkpoint_for_train` decides what an existing checkpoint means;
* the end: FINISHED, FAILED (diverged, with step and reason; or an error, such as a plugin's
  broken rule, with its reason) or KILLED (interrupted, with the signal), and a reopened run
  forgets that it was interrupted or failed (``resumed_after``, ``retried_after`` keep it);
* checkpoints between Ray Tune and the trial's own folder (:class:`RayCheckpoints`).

MLflow client calls, and the fluent active run of a working trial; Ray is imported where a Ray trial needs it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from mae_core.config import Config
from mae_core.errors import UserError
from mae_core.checkpoint import changed_keys, load_latest_checkpoint

from . import tracking

CHECKPOINT_FILES = ("checkpoint.pt", "checkpoint.pt.prev")


# ------------------------------------------------------------------------------ identity


def run_in_checkpoint(checkpoint_path: Path | None) -> str | None:
    """The MLflow run id the checkpoint at ``checkpoint_path`` carries (None: no checkpoint)."""
    if checkpoint_path is None:
        return None
    state, _ = load_latest_checkpoint(checkpoint_path)
    return (state or {}).get("extra", {}).get("mlflow_run_id") or None


def run_for_cell(client: MlflowClient, *, tracking_uri: str, experiment: str, parent_run_id: str,
                 cell: str) -> str | None:
    """The MLflow run of grid cell ``cell`` under the study's parent run, if one was created
    (a retried or resumed trial reopens it; otherwise :func:`opened` creates it)."""
    experiment_id = tracking.ensure_experiment(client, experiment, tracking_uri)
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.cell_id = '{cell}' and tags.`mlflow.parentRunId` = '{parent_run_id}'",
        max_results=1,
    )
    return found[0].info.run_id if found else None


@contextmanager
def opened(client: MlflowClient, run_id: str | None, *, tracking_uri: str, experiment: str,
           run_name: str, parent_run_id: str | None = None, tags: dict[str, str] | None = None,
           system_metrics: bool = True) -> Iterator[str]:
    """The trial's run as MLflow's active run for the block, and its id: ``run_id`` reopened
    (RUNNING again, an earlier ``interrupted`` tag kept as ``resumed_after``), or a new run
    (``mlflow.start_run(parent_run_id=...)``) named ``run_name`` with ``tags``."""
    if run_id is not None:
        tracking.reopen(client, run_id)
        experiment_id = None
    else:
        experiment_id = tracking.ensure_experiment(client, experiment, tracking_uri)
    with tracking.fluent_run(tracking_uri, run_id=run_id, experiment_id=experiment_id, run_name=run_name,
                             parent_run_id=parent_run_id, tags=tags, system_metrics=system_metrics) as active:
        yield active


# ------------------------------------------------------------------------- fresh or resume


def checkpoint_for_train(path: Path, config: Config, tracking_uri: str, *, resume: bool) -> Path:
    """The checkpoint file ``mae-study train`` writes, after deciding what an existing one means.

    Every run checkpoints (``checkpoint_every``). ``--resume`` continues the run whose checkpoint
    is at ``path`` (with the same keys); without it, a checkpoint of an interrupted run is never
    overwritten (that would lose the user's work), while one of a finished run is removed (it is
    kept as that run's MLflow artifact) and training starts afresh.
    """
    state, damaged = load_latest_checkpoint(path)
    if resume:
        if state is None and damaged:  # the files are there, but neither reads: name them and why
            raise UserError(f"--resume: {'; '.join(damaged)}; run without --resume to start again")
        if state is None:
            raise UserError(f"--resume: no readable checkpoint at {path}; run without --resume to start")
        changed = changed_keys(config, state["config"])
        if changed:
            raise UserError(f"--resume: {path} was written with other values of {', '.join(changed)}; "
                            "resume with the same keys, or run without --resume in another --out")
        return path
    if state is None or not _unfinished(state, config.steps, tracking_uri):
        for stale in (path, path.with_name(path.name + ".prev")):
            stale.unlink(missing_ok=True)
        return path
    raise UserError(f"{path} holds an interrupted run at step {int(state['step'])} of {config.steps}: "
                    "pass --resume to continue it, or delete the file to start over")


def _unfinished(state: dict[str, Any], steps: int, tracking_uri: str) -> bool:
    """Whether the run that wrote ``state`` did not finish (training or its evaluation)."""
    if int(state["step"]) < steps:
        return True
    run_id = state.get("extra", {}).get("mlflow_run_id")
    if not run_id or tracking.missing_sqlite_store(tracking_uri):
        return False  # no run to finish: nothing is lost by starting again
    try:
        return MlflowClient(tracking_uri).get_run(run_id).info.status != "FINISHED"
    except MlflowException:
        return False


# --------------------------------------------------------------------------------- the end


def diverged(client: MlflowClient, run_id: str, step: int, reason: str) -> None:
    tracking.set_tags(client, run_id, {"failure_step": step, "failure_reason": reason})
    client.set_terminated(run_id, "FAILED")


def failed(client: MlflowClient, run_id: str, error: Exception) -> None:
    """FAILED, with the error as the ``failure_reason`` tag (one line: a plugin's broken rule,
    :mod:`mae_core.plugin_checks`, reads as it was raised; anything else with its type first).
    The run stays resumable from its checkpoint: Ray retries a failed trial and ``--resume``
    continues it, both reopening the run (the reason kept as ``retried_after``)."""
    text = " ".join(str(error).split())
    reason = text if isinstance(error, UserError) else (f"{type(error).__name__}: {text}" if text
                                                         else type(error).__name__)
    tracking.set_tags(client, run_id, {"failure_reason": reason})
    client.set_terminated(run_id, "FAILED")


def interrupted(client: MlflowClient, run_id: str, error: BaseException, signal_name: str | None) -> None:
    """KILLED, resumable from its checkpoint, with the signal as the ``interrupted`` tag (or, for
    an exit that is no exception, such as Ray stopping the trial with ``SystemExit``, its type)."""
    signalled = isinstance(error, KeyboardInterrupt) and signal_name is not None
    tracking.set_tags(client, run_id, {"interrupted": signal_name if signalled else type(error).__name__})
    client.set_terminated(run_id, "KILLED")


def finished(client: MlflowClient, run_id: str) -> None:
    client.set_terminated(run_id, "FINISHED")


# ------------------------------------------------------------------- Ray's checkpoints


class RayCheckpoints:
    """Moves a trial's checkpoint files between Ray Tune and a private working folder.

    The trainer writes ``<work>/checkpoint.pt`` (and ``.prev``); Ray keeps copies so a retried
    or resumed trial starts from the last one it received.
    """

    def __init__(self) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="mae-trial-"))
        self.path = self.work / CHECKPOINT_FILES[0]

    def restore(self) -> None:
        """Copy the checkpoint Ray hands a retried or resumed trial into the working folder."""
        from ray import tune

        restored = tune.get_checkpoint()
        if restored is None:
            return
        with restored.as_directory() as folder:
            _copy_checkpoints(Path(folder), self.work)

    def report(self, metrics: dict[str, float]) -> None:
        """``tune.report`` with the current checkpoint files attached."""
        from ray import tune

        with tempfile.TemporaryDirectory() as folder:
            _copy_checkpoints(self.work, Path(folder))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def _copy_checkpoints(source: Path, destination: Path) -> None:
    for name in CHECKPOINT_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, destination / name)


# ------------------------------------------------------------- the study's state (study.json)


STATE_FILE = "study.json"  # in the study's output folder: parent run id, Ray folder, grid


class StateFileError(UserError):
    """A study.json that cannot be read (one line naming it)."""


def load_state(out_dir: Path) -> dict[str, Any] | None:
    """The study's saved state (None: no study.json); a damaged or truncated file is a
    StateFileError naming it, not a traceback."""
    path = out_dir / STATE_FILE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StateFileError(f"{path}: damaged, not the JSON mae-study run writes ({type(error).__name__}); "
                             f"restore it, or move {out_dir} away to start the study afresh") from None
    except OSError as error:
        raise StateFileError(f"{path}: cannot be read ({error.strerror or error})") from None
    if not isinstance(state, dict) or not isinstance(state.get("cells"), list):
        raise StateFileError(f"{path}: not a study state written by mae-study run (a JSON object with its "
                             f"parent run and cells); restore it, or move {out_dir} away to start the study afresh")
    return state


def save_state(out_dir: Path, state: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, default=str))
    os.replace(tmp, out_dir / STATE_FILE)
