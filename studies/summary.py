"""What a study's parent run shows in MLflow once its grid has run: summary metrics and a table.

Without them the parent run of a study has no metrics, and MLflow's chart view of it is empty.
Logged once, when the study ends (not when it is interrupted), from the child runs themselves
(so trials finished before a ``--resume`` count too):

* ``cell_mean/<metric>``: the mean over seeds of each finished cell, at step = the cell's index
  in the grid (the order of :attr:`StudyPlan.cells`): one chart per metric across the grid;
* ``reference/<metric>``: the reference row's mean over seeds, one value per metric, to compare
  parent runs (studies) in MLflow's runs table;
* ``trials_finished`` and ``trials_failed``;
* the table of cells (index, axis values, finished and failed counts, every mean), logged with
  ``log_table`` as ``study_cells.json``.

The metrics are the spec's risks and the downstream accuracies (``evaluation.metrics``). These
are descriptions; what a study *claims* is the report's business (paired tests, intervals).
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from evaluation.metrics import DOWNSTREAM_METRICS, RISK_METRICS

from .study import cell_id

SUMMARY_METRICS = (*RISK_METRICS, *DOWNSTREAM_METRICS)
TABLE_FILE = "study_cells.json"
DONE_TAG = "summary_logged"  # a study resumed after it ended (errored trials) is summarised once


def cell_table(children: list, cells: list[dict[str, Any]], axes: list[str]) -> pd.DataFrame:
    """A row per grid cell (seeds pooled) in grid order: ``cell`` (index), the axis values,
    ``n_finished``, ``n_failed`` and the mean of each summary metric over finished runs."""
    index_of: dict[str, int] = {}  # a trial's cell_id -> its row (cells that differ only by seed share one)
    by_key: dict[tuple[str, ...], dict[str, Any]] = {}
    for cell in cells:
        key = tuple(str(cell.get(axis)) for axis in axes)
        if key not in by_key:
            by_key[key] = {"cell": len(by_key), **{axis: cell.get(axis) for axis in axes}}
        index_of[cell_id(cell)] = by_key[key]["cell"]
    rows = list(by_key.values())
    values: dict[int, list[dict[str, float]]] = {row["cell"]: [] for row in rows}
    failed = {row["cell"]: 0 for row in rows}
    for run in children:
        where = index_of.get(run.data.tags.get("cell_id", ""))
        if where is None:
            continue
        if run.info.status == "FINISHED":
            values[where].append(run.data.metrics)
        else:
            failed[where] += 1
    for row in rows:
        finished = values[row["cell"]]
        row["n_finished"], row["n_failed"] = len(finished), failed[row["cell"]]
        for metric in SUMMARY_METRICS:
            logged = [m[metric] for m in finished if metric in m]
            row[metric] = sum(logged) / len(logged) if logged else float("nan")
    table = pd.DataFrame(rows)
    return table.dropna(axis=1, how="all")  # metrics no trial of this study logs


def _same(a: Any, b: Any) -> bool:
    return a == b or str(a) == str(b)


def log_study_summary(client: MlflowClient, parent_run_id: str, experiment_id: str,
                      cells: list[dict[str, Any]], axes: list[str], reference: dict[str, Any]) -> pd.DataFrame | None:
    """Log the summary metrics and the cell table on the parent run (once); the table, or None
    when it was logged before."""
    parent = client.get_run(parent_run_id)
    if DONE_TAG in parent.data.tags:
        return None
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
                                  max_results=50_000)
    table = cell_table(children, cells, axes)
    now = int(time.time() * 1000)
    metrics = [Metric("trials_finished", float(table["n_finished"].sum()), now, 0),
               Metric("trials_failed", float(table["n_failed"].sum()), now, 0)]
    present = [m for m in SUMMARY_METRICS if m in table]
    for _, row in table.iterrows():
        metrics += [Metric(f"cell_mean/{m}", float(row[m]), now, int(row["cell"])) for m in present if row[m] == row[m]]
    is_reference = table[axes].apply(lambda row: all(_same(row[a], reference.get(a)) for a in axes), axis=1) \
        if axes else pd.Series(True, index=table.index)
    for _, row in table[is_reference].head(1).iterrows():
        metrics += [Metric(f"reference/{m}", float(row[m]), now, 0) for m in present if row[m] == row[m]]
    for start in range(0, len(metrics), 1000):  # MLflow's batch limit for metrics
        client.log_batch(parent_run_id, metrics=metrics[start:start + 1000])
    client.log_table(parent_run_id, data=table.astype(object).where(table.notna(), None), artifact_file=TABLE_FILE)
    client.set_tag(parent_run_id, DONE_TAG, "true")
    return table
