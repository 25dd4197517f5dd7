"""``--search`` through real Ray Tune: random search (3 samples) recorded in MLflow like a grid
and reported as a ranking; an Optuna search interrupted with Ctrl-C after its first trial and
finished by ``--resume`` from Ray Tune's saved searcher state."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest
from mlflow.tracking import MlflowClient

from conftest import run_cli, seed_command_store

pytestmark = pytest.mark.slow

ENV = dict(os.environ)  # conftest sets the Ray and MLflow variables
ONE_ARM = ["run", "mask_ratio", "--smoke", "mask_ratio=0.75", "seeds=0", "lr=loguniform:1e-4:1e-2"]


def cli(args: list[str], cwd) -> subprocess.Popen:
    seed_command_store(args, cwd)
    return subprocess.Popen([sys.executable, "-m", "studies.cli", *args], cwd=cwd, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def study_runs(tmp_path):
    """(the parent run, its child runs) of the one study in the store."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mae_runs/mlflow.db")  # run's --out holds the store
    recorded = client.search_runs([e.experiment_id for e in client.search_experiments()])
    [parent] = [r for r in recorded if "mlflow.parentRunId" not in r.data.tags]
    return parent, [r for r in recorded if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]


def finished_children(db) -> int:
    """Read-only peek at the store while the driver writes it."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as connection:
            return connection.execute(
                "SELECT count(*) FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                "WHERE t.key = 'mlflow.parentRunId' AND r.status = 'FINISHED'").fetchone()[0]
    except sqlite3.Error:
        return 0


def check_sampled(children, samples: int) -> None:
    assert len(children) == samples and {r.info.status for r in children} == {"FINISHED"}, \
        [(r.info.run_name, r.info.status) for r in children]
    lrs = [float(r.data.params["lr"]) for r in children]
    assert len(set(lrs)) == samples and all(1e-4 <= lr <= 1e-2 for lr in lrs), lrs
    assert len({r.data.tags["cell_id"] for r in children}) == samples
    assert all("probe_linear_acc" in r.data.metrics for r in children)


def test_a_random_search_is_recorded_like_a_grid_and_reported_as_a_ranking(tmp_path):
    done = run_cli([*ONE_ARM, "--search", "random", "--samples", "3"], tmp_path)
    assert done.returncode == 0, done.stderr
    parent, children = study_runs(tmp_path)
    search = json.loads(parent.data.tags["search"])
    assert search == {"algorithm": "random", "samples": 3, "metric": "probe_linear_acc", "mode": "max",
                      "space": {"lr": "loguniform:1e-4:1e-2"}}
    assert json.loads(parent.data.tags["study_axes"]) == ["mask_ratio", "lr"]
    check_sampled(children, 3)

    report = run_cli(["report", "mask_ratio", "--smoke", "--format", "png"], tmp_path)
    assert report.returncode == 0, report.stderr
    ranking = pd.read_csv(tmp_path / "mae_runs" / "mask_ratio-smoke" / "report" / "search.csv")
    assert len(ranking) == 3 and ranking["rank"].tolist() == [1, 2, 3]
    assert ranking["mean"].is_monotonic_decreasing  # probe accuracy: higher is better
    assert "zip:" in (tmp_path / "mae_runs" / "mask_ratio-smoke" / "report" / "findings.md").read_text()


def test_an_interrupted_optuna_search_resumes_from_its_saved_searcher(tmp_path):
    pytest.importorskip("optuna")
    driver = cli([*ONE_ARM, "--search", "optuna", "--samples", "2", "--max-concurrent", "1"], tmp_path)
    deadline = time.monotonic() + 600
    while finished_children(tmp_path / "mae_runs" / "mlflow.db") < 1:
        assert driver.poll() is None, driver.stdout.read()
        assert time.monotonic() < deadline, "no trial finished in time"
        time.sleep(0.5)
    own = psutil.Process(driver.pid).children(recursive=True)
    driver.send_signal(signal.SIGINT)
    output, _ = driver.communicate(timeout=300)
    psutil.wait_procs([p for p in own if p.is_running()], timeout=60)
    assert driver.returncode == 130, output
    line = next(line.strip() for line in output.splitlines() if line.strip().startswith("mae-study "))
    assert line.endswith("--resume") and "--search optuna" in line, line

    resumed = cli(shlex.split(line)[1:], tmp_path)
    output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output
    parent, children = study_runs(tmp_path)
    assert parent.info.status == "FINISHED" and json.loads(parent.data.tags["search"])["algorithm"] == "optuna"
    check_sampled(children, 2)  # the searcher's state came back: two samples, not two plus more
    state = json.loads((tmp_path / "mae_runs" / "mask_ratio-smoke" / "study.json").read_text())
    assert state["complete"] is True and state["search"]["samples"] == 2
