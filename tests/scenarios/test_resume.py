"""Kill the driver of a running study with SIGKILL; ``--resume`` finishes it, losing nothing."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import mlflow
import psutil
import pytest
from mlflow.tracking import MlflowClient

from conftest import seed_command_store

pytestmark = pytest.mark.slow

ENV = dict(os.environ)  # conftest sets the Ray and MLflow variables
ARGS = ["run", "mask_ratio", "--smoke", "seeds=0,1", "steps=120"]


def cli(*args: str, cwd) -> subprocess.Popen:
    seed_command_store(list(args), cwd)
    return subprocess.Popen([sys.executable, "-m", "studies.cli", *args], cwd=cwd, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def child_runs(uri: str):
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["mae-study"], filter_string="tags.study = 'mask_ratio'")
    return runs[runs["tags.mlflow.parentRunId"].notna()] if len(runs) else runs


def child_statuses(db) -> dict[str, str]:
    """Read-only peek at the store while the driver writes it (an MLflow client would try to
    create the schema concurrently, which SQLite does not survive)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as connection:
            rows = connection.execute(
                "SELECT r.run_uuid, r.status FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                "WHERE t.key = 'mlflow.parentRunId'").fetchall()
    except sqlite3.Error:
        return {}
    return dict(rows)


def test_sigkilled_study_resumes_to_one_finished_run_per_cell(tmp_path):
    uri = f"sqlite:///{tmp_path}/mae_runs/mlflow.db"  # run's --out (default mae_runs) holds the store
    driver = cli(*ARGS, cwd=tmp_path)
    deadline = time.monotonic() + 240
    finished_before = None
    while time.monotonic() < deadline:  # wait until one trial is done and others are under way
        time.sleep(2)
        statuses = child_statuses(tmp_path / "mae_runs" / "mlflow.db")
        if "FINISHED" in statuses.values() and "RUNNING" in statuses.values():
            runs = child_runs(uri)
            finished_before = runs[runs["status"] == "FINISHED"].set_index("run_id")
            break
        assert driver.poll() is None, driver.stdout.read()
    assert finished_before is not None, "no trial finished in time"
    # The crash takes the driver's whole Ray tree with it (GCS, raylet, workers) and nothing
    # else: a global `ray stop` would also kill any study the user is running on this machine.
    own_ray = psutil.Process(driver.pid).children(recursive=True)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    for process in own_ray:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(own_ray, timeout=30)

    resumed = cli(*ARGS, "--resume", cwd=tmp_path)
    output, _ = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, output

    runs = child_runs(uri)
    assert len(runs) == 4 and set(runs["status"]) == {"FINISHED"}, runs[["status", "tags.cell_id"]]
    assert runs["tags.cell_id"].nunique() == 4
    client = MlflowClient(uri)
    for run_id in runs["run_id"]:
        steps = [m.step for m in client.get_metric_history(run_id, "train_loss")]
        assert len(steps) == len(set(steps)) == 12, (run_id, steps)  # 120 steps / log_every 10
    for run_id, before in finished_before.iterrows():  # finished trials were not re-run
        after = runs.set_index("run_id").loc[run_id]
        assert after["metrics.test_mae_risk"] == before["metrics.test_mae_risk"]
        assert after["end_time"] == before["end_time"]
