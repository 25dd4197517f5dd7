"""Faults during a study: a trial's worker is SIGKILLed mid-training; Ray retries it from its
last checkpoint and it finishes in the same MLflow run."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from conftest import seed_command_store

pytestmark = pytest.mark.slow
ENV = dict(os.environ)  # conftest sets the Ray and MLflow variables


def running_trial_with_progress(db, min_step: int) -> tuple[str, int] | None:
    """(run id, worker pid) of a RUNNING trial that has logged ``min_step``, read-only."""
    query = """
        SELECT r.run_uuid, t.value FROM runs r
        JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'ray_worker_pid'
        JOIN metrics m ON m.run_uuid = r.run_uuid AND m.key = 'train_loss'
        WHERE r.status = 'RUNNING' GROUP BY r.run_uuid HAVING MAX(m.step) >= ?"""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as connection:
            row = connection.execute(query, (min_step,)).fetchone()
    except sqlite3.Error:
        return None
    return (row[0], int(row[1])) if row else None


def test_sigkilled_trial_worker_is_retried_in_the_same_run(tmp_path):
    args = ["run", "mask_ratio", "--smoke", "seeds=0", "mask_ratio=0.75", "steps=400"]
    seed_command_store(args, tmp_path)
    driver = subprocess.Popen(
        [sys.executable, "-m", "studies.cli", *args],
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim = None
    deadline = time.monotonic() + 240
    while victim is None and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.5)
        victim = running_trial_with_progress(tmp_path / "mae_runs" / "mlflow.db", min_step=40)  # run's --out
    assert victim is not None, "no trial reached step 40 in time"
    run_id, pid = victim
    os.kill(pid, signal.SIGKILL)
    output, _ = driver.communicate(timeout=400)
    assert driver.returncode == 0, output

    uri = f"sqlite:///{tmp_path}/mae_runs/mlflow.db"
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["mae-study"], filter_string="tags.study = 'mask_ratio'")
    children = runs[runs["tags.mlflow.parentRunId"].notna()]
    assert list(children["run_id"]) == [run_id], "the retry reopened the same run"
    assert list(children["status"]) == ["FINISHED"]
    resumed = int(children["tags.resumed_from_step"].iloc[0])
    assert 0 < resumed < 400, "continued from a checkpoint, not from scratch"
    steps = [m.step for m in MlflowClient(uri).get_metric_history(run_id, "train_loss")]
    assert sorted(steps) == list(range(10, 401, 10)), "every step once"
