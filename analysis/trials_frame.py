"""The MLflow store -> one tidy pandas frame (a row per trial), plus axes and loss histories.

A study is a parent run tagged ``study=<name>`` (with ``study_axes``, a JSON list of axis keys,
and ``grid``, JSON of the axes); its trials are child runs (``mlflow.parentRunId``) whose params
are the resolved config as strings. Only the newest parent of a study is read, so re-running a
study replaces its report rather than mixing two grids; ``smoke=True``/``False`` narrows that to
smoke or full runs (a parent tagged ``smoke`` = "True" is a smoke run), which ``mae-study
report`` always does, so a smoke run is never reported as the study nor the reverse.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import numpy as np
import pandas as pd
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME
from pydantic.fields import FieldInfo

from evaluation.metrics import (COMPUTE_METRICS, DIAGNOSTIC_METRICS, DOWNSTREAM_METRICS, REFERENCE_METRICS,
                                RISK_METRICS)
from mae_core.config import EVAL_PREFIX, Config, EvalConfig
from mae_core.errors import UserError

from .study_header import StudyHeader, choose_parent


class ReportError(UserError):
    """A report cannot be made (no such study, no runs, unwritable folder): one line."""


# The final metrics a trial logs; every one becomes a float column (NaN when a run lacks it).
# The vocabulary lives in evaluation.metrics (one table); these are its groups. Diagnostics
# (an MAE's all-visible error) are columns of the tables but never risks: nothing correlates
# or plots them as one.
FINAL_METRICS = (*RISK_METRICS, "test_mae_risk_stderr", "test_baseline_risk", *DIAGNOSTIC_METRICS,
                 *DOWNSTREAM_METRICS, *REFERENCE_METRICS, "scratch_best_finetune_steps", "finetune_best_steps",
                 "data_train_test_duplicates", "train_loss", "train_seconds", *COMPUTE_METRICS)

# Params the config derives (Config.resolved()) rather than declares: their types. The
# effective mask ratio is one of them (stores written before it became a param only also hold
# it as a metric; the param wins, see _row).
DERIVED_PARAM_TYPES: dict[str, type] = {
    "num_patches": int, "patch_dim": int, "num_visible": int, "warmup_steps": int,
    "effective_mask_ratio": float, "actual_lr": float,
}

_PAGE = 1000  # runs per search request


# ------------------------------------------------------------------------------- casting


def _field_types(annotation: Any) -> tuple[type, ...]:
    """The scalar types a Config annotation admits: ``int | None`` -> (int, NoneType);
    ``Literal["a"]`` -> (str,)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # a bounded member of a union (``int ≥ 0 | all``): its type
        return _field_types(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return tuple({type(v) for v in typing.get_args(annotation)})
    if origin in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(annotation) for t in _field_types(arg))
    return (annotation,)


def _guess(text: str) -> Any:
    """A param outside the config (a study may log extras): int, float, bool or None if it reads
    as one, else the text."""
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _config_field(key: str) -> FieldInfo | None:
    """The declared field of a param: ``mask_ratio`` in Config, ``eval.finetune_shots`` in EvalConfig."""
    if key.startswith(f"{EVAL_PREFIX}."):
        return EvalConfig.model_fields.get(key.removeprefix(f"{EVAL_PREFIX}."))
    return Config.model_fields.get(key)


def cast_param(key: str, text: str) -> Any:
    """An MLflow param string back to its Python value, using Config's annotations."""
    if text == "None":
        return None
    if key in DERIVED_PARAM_TYPES:
        return DERIVED_PARAM_TYPES[key](text)
    field = _config_field(key)
    if field is None:
        return _guess(text)
    kinds = _field_types(field.annotation)
    if bool in kinds and text in ("True", "False"):
        return text == "True"
    for kind in (int, float):  # int before float: "3" is an int field's 3
        if kind in kinds:
            try:
                return kind(text)
            except ValueError:
                continue
    return text


# ------------------------------------------------------------------------------- queries


def _client(tracking_uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri)


def _experiment_id(client: MlflowClient, experiment: str, tracking_uri: str) -> str:
    try:
        found = client.get_experiment_by_name(experiment)
    except MlflowException as error:
        first_line = str(error.message).splitlines()[0] if str(error.message) else type(error).__name__
        raise ReportError(f"cannot read the MLflow store {tracking_uri}: {first_line}") from None
    if found is None:
        raise ReportError(f"no experiment {experiment!r} in {tracking_uri}")
    return found.experiment_id


def search_all(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Run]:
    """Every run of the experiment matching ``filter_string``, page by page."""
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string, max_results=_PAGE, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _study_runs(tracking_uri: str, study: str, experiment: str,
                parent_run_id: str | None = None, smoke: bool | None = None) -> tuple[Run, list[Run]]:
    """(newest parent run of ``study``, or the one with ``parent_run_id``; its child runs).
    ``smoke`` True or False reads only a smoke or only a full run (:func:`analysis.study_header.choose_parent`)."""
    client = _client(tracking_uri)
    experiment_id = _experiment_id(client, experiment, tracking_uri)
    quoted = study.replace("'", "\\'")
    tagged = search_all(client, experiment_id, f"tags.study = '{quoted}'")
    parents = [run for run in tagged if MLFLOW_PARENT_RUN_ID not in run.data.tags]
    if not parents:
        known = sorted({run.data.tags["study"] for run in search_all(client, experiment_id, "")
                        if "study" in run.data.tags})
        have = f"; studies there: {', '.join(known)}" if known else "; it holds no studies"
        raise ReportError(f"no study {study!r} in experiment {experiment!r} at {tracking_uri}{have}")
    if parent_run_id is None:  # an `evaluate` run (tagged evaluation_of) is read when named with --run
        parents = [run for run in parents if "evaluation_of" not in run.data.tags] or parents
    if parent_run_id is not None:
        chosen = [run for run in parents if run.info.run_id == parent_run_id]
        if not chosen:
            ids = ", ".join(f"{run.info.run_id} ({run.info.run_name})" for run in parents)
            raise ReportError(f"--run {parent_run_id} is not a run of study {study!r}; its runs: {ids}")
        parents = chosen
    parent = choose_parent(parents, smoke)
    if parent is None:
        _refuse_kind(study, smoke, tracking_uri, parent_run_id)
    children = [run for run in tagged if run.data.tags.get(MLFLOW_PARENT_RUN_ID) == parent.info.run_id]
    if not children:
        raise ReportError(f"study {study!r} (run {parent.info.run_id}) has no trial runs in {tracking_uri}")
    return parent, children


def _refuse_kind(study: str, smoke: bool, tracking_uri: str, parent_run_id: str | None) -> None:
    """No run of the kind asked for, only of the other: refuse naming the flag, since a report
    never takes a smoke run for the study or the reverse."""
    if parent_run_id is not None:
        raise ReportError(f"--run {parent_run_id} is a {'full' if smoke else 'smoke'} run of study {study!r}: "
                          + ("drop --smoke to report it" if smoke else "pass --smoke to report it (its title says so)"))
    if smoke:
        raise ReportError(f"study {study!r} has no smoke run in {tracking_uri}, only full runs: drop --smoke")
    raise ReportError(f"study {study!r} has only smoke runs in {tracking_uri}: pass --smoke to report one "
                      "(its title says so), or run the full study first")


def _row(run: Run, study: str) -> dict[str, Any]:
    tags = run.data.tags
    row: dict[str, Any] = {
        "run_id": run.info.run_id,
        "run_name": tags.get(MLFLOW_RUN_NAME, run.info.run_name),
        "status": run.info.status,
        "study": study,
        "cell_id": tags.get("cell_id"),
        "failure_reason": tags.get("failure_reason"),
    }
    if "pretraining" in tags:  # studies.pretrained: "computed KEY" | "reused KEY"
        row["pretraining"] = tags["pretraining"].split()[0]
        if "pretraining_source_steps" in tags:  # read at that update of a run this long
            row["pretraining_source_steps"] = int(tags["pretraining_source_steps"])
    for key, text in run.data.params.items():
        row[key] = cast_param(key, text)
    for key, value in run.data.metrics.items():
        if key in row and row[key] is not None:  # a param an older store also logged as a metric
            continue
        row[key] = float(value)
    return row


def load_runs(tracking_uri: str, study: str, experiment: str = "mae-study",
              parent_run_id: str | None = None, smoke: bool | None = None) -> pd.DataFrame:
    """A row per trial of the newest run of ``study`` (or of its run ``parent_run_id``; with
    ``smoke`` True or False, of its newest smoke or full run only).

    Columns: ``run_id, run_name, status, study, cell_id, failure_reason``, every param typed as
    Config declares it (``seed`` int, ``mask_ratio`` float, ``class_token`` bool, None kept),
    and every metric's last value as float; each of :data:`FINAL_METRICS` is present (NaN when
    no run logged it). Sorted by the study's axes, then seed.
    """
    parent, children = _study_runs(tracking_uri, study, experiment, parent_run_id, smoke)
    return typed_frame(pd.DataFrame([_row(run, study) for run in children]), _axes_of(parent))


def typed_frame(frame: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    """Trial rows (params already cast) -> :func:`load_runs`' frame: every final metric a float
    column, derived params float, ``seed`` int; sorted by ``axes``, then seed."""
    for metric in FINAL_METRICS:
        if metric not in frame:
            frame[metric] = np.nan
        frame[metric] = pd.to_numeric(frame[metric], errors="coerce").astype(float)
    for key, kind in DERIVED_PARAM_TYPES.items():  # float even where a run died before its params
        if kind is float and key in frame:
            frame[key] = pd.to_numeric(frame[key], errors="coerce").astype(float)
    if "seed" in frame:  # nullable only if some run died before logging its params
        seeds = pd.to_numeric(frame["seed"])
        frame["seed"] = seeds.astype("Int64" if seeds.isna().any() else int)
    order = [key for key in axes if key in frame] + (["seed"] if "seed" in frame else [])
    if order:
        frame = frame.sort_values(order, kind="stable", na_position="last")
    return frame.reset_index(drop=True)


def _axes_of(parent: Run) -> list[str]:
    return StudyHeader.from_run(parent).axes


def load_study_axes(tracking_uri: str, study: str, experiment: str = "mae-study") -> list[str]:
    """The axis keys the study varies (the parent's ``study_axes`` tag, else ``grid``'s keys)."""
    parent, _ = _study_runs(tracking_uri, study, experiment)
    return _axes_of(parent)


def load_study_info(tracking_uri: str, study: str, experiment: str = "mae-study",
                    parent_run_id: str | None = None, smoke: bool | None = None) -> dict[str, Any]:
    """The parent run's id, name, start time (ms), axes and grid, for a report's header; its
    ``smoke`` tag (True only for "True"), ``paper`` and ``reference`` (the tag's JSON mapping of
    axis -> value, None where the tag is absent or unreadable), ``zip`` (the zipped groups, a
    list of key -> values mappings; empty for none) and ``search`` (the search's algorithm,
    samples, metric, mode and space; None for a grid), ``claims`` (the study file's declared
    claims as written, empty for none), ``sequential`` (``--until-decided``: its plan and the
    seeds each cell held at every look; None otherwise), ``added_outside_plan`` (seeds added
    by ``--add-seeds`` with no sequential plan) and, where the run recorded them when it started,
    ``claims_sha256`` and ``study_file_commit`` (:mod:`analysis.registration`)."""
    parent, _ = _study_runs(tracking_uri, study, experiment, parent_run_id, smoke)
    return StudyHeader.from_run(parent).to_json()


def load_history(tracking_uri: str, run_ids: list[str], key: str = "train_loss") -> pd.DataFrame:
    """Every recorded step of metric ``key``: columns ``run_id, step, value``, sorted."""
    client = _client(tracking_uri)
    rows = [(run_id, m.step, float(m.value))
            for run_id in run_ids for m in client.get_metric_history(run_id, key)]
    history = pd.DataFrame(rows, columns=["run_id", "step", "value"])
    history["step"] = history["step"].astype(int)
    return history.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
