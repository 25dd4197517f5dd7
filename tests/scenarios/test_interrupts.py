"""Ctrl-C and SIGTERM are recorded as interruptions, never as success, and ``--resume`` finishes.

Each test starts the real command in its own process group, sends one signal to the driver
alone at a chosen moment (found by reading the MLflow store read-only), and checks exit status
130, the printed ``--resume`` command, KILLED runs with the signal as their tag, and a study
left incomplete; then the printed command finishes the work with one FINISHED run per cell.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from conftest import seed_command_store
from studies.testing_hooks import PAUSE_BETWEEN_LOOKS_VARIABLE, PAUSE_EVALUATION_VARIABLE, PAUSE_VARIABLE

pytestmark = pytest.mark.slow

ENV = dict(os.environ)  # conftest sets the Ray and MLflow variables
STUDY = ["run", "mask_ratio", "--smoke", "seeds=0", "steps=60"]  # 2 cells
TRAIN = ["train", "train_limit=256", "test_limit=48", "steps=30", "log_every=10",
         "checkpoint_every=20", "encoder_depth=2", "eval.linear_cs=1", "eval.knn_ks=5",
         "eval.fewshot_draws=1"]


def start(args: list[str], cwd: Path, pause_at_step: int | None = None,
          pause_in_evaluation: bool = False, pause_between_looks: bool = False) -> subprocess.Popen:
    """The command in its own process group; with ``pause_at_step`` every trial's loop holds
    after that update (``studies.testing_hooks``) until the signal comes; with
    ``pause_in_evaluation`` every trial holds at the start of its evaluation."""
    seed_command_store(args, cwd)
    env = dict(ENV)
    if pause_at_step is not None:
        env[PAUSE_VARIABLE] = str(pause_at_step)
    if pause_in_evaluation:
        env[PAUSE_EVALUATION_VARIABLE] = "1"
    if pause_between_looks:  # a sequential run's driver holds after recording a look
        env[PAUSE_BETWEEN_LOOKS_VARIABLE] = "1"
    return subprocess.Popen([sys.executable, "-m", "studies.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def query(db: Path, sql: str) -> list[tuple]:
    """A read-only peek at the store while the driver writes it."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as connection:
            return connection.execute(sql).fetchall()
    except sqlite3.Error:
        return []


def wait_for(condition, driver: subprocess.Popen, what: str, timeout: float = 420) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        assert driver.poll() is None, f"ended before {what}:\n{driver.stdout.read()}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def interrupt(driver: subprocess.Popen, sig: signal.Signals) -> str:
    """Send ``sig`` to the driver only; wait for it and its Ray processes; its output."""
    own = psutil.Process(driver.pid).children(recursive=True)
    driver.send_signal(sig)
    output, _ = driver.communicate(timeout=180)
    psutil.wait_procs([p for p in own if p.is_running()], timeout=60)
    return output


def resume_command(output: str) -> list[str]:
    """The command the interrupted process printed, as argv for this interpreter."""
    line = next(line.strip() for line in output.splitlines() if line.strip().startswith("mae-study "))
    words = shlex.split(line)
    assert words[-1] == "--resume", line
    return words[1:]


def runs(uri: str) -> list:
    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def in_evaluation(db: Path, steps: int) -> bool:
    """Some run logged its last train_loss and is still RUNNING: it is evaluating."""
    return bool(query(db, "SELECT r.run_uuid FROM runs r JOIN metrics m ON m.run_uuid = r.run_uuid "
                          f"WHERE r.status = 'RUNNING' AND m.key = 'train_loss' AND m.step = {steps}"))


def check_interrupted_study(tmp_path: Path, output: str, driver, reason: str) -> list[str]:
    assert driver.returncode == 130, output
    assert f"interrupted by {reason}" in output and "Tuner.restore" not in output, output
    assert "fetch metrics" not in output, output  # Ray's list of trials that had not started
    state = json.loads((tmp_path / "mae_runs" / "mask_ratio-smoke" / "study.json").read_text())
    assert state["complete"] is False and state["interrupted"] == reason
    uri = f"sqlite:///{tmp_path}/mae_runs/mlflow.db"  # run's --out (default mae_runs) holds the store
    recorded = runs(uri)
    assert recorded and all(r.info.status in ("FINISHED", "KILLED") for r in recorded), \
        [(r.info.run_name, r.info.status) for r in recorded]
    parent = [r for r in recorded if "mlflow.parentRunId" not in r.data.tags]
    assert [p.info.status for p in parent] == ["KILLED"] and parent[0].data.tags["interrupted"] == reason
    return resume_command(output)


def check_resumed_study(tmp_path: Path, command: list[str]) -> None:
    resumed = start(command, tmp_path)
    output, _ = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, output
    recorded = runs(f"sqlite:///{tmp_path}/mae_runs/mlflow.db")
    children = [r for r in recorded if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2 and {r.info.status for r in children} == {"FINISHED"}, \
        [(r.info.run_name, r.info.status) for r in children]
    assert len({r.data.tags["cell_id"] for r in children}) == 2
    assert all("interrupted" not in r.data.tags for r in recorded)
    state = json.loads((tmp_path / "mae_runs" / "mask_ratio-smoke" / "study.json").read_text())
    assert state["complete"] is True


def test_sigint_before_ray_starts_leaves_an_unfinished_study_that_resumes(tmp_path):
    driver = start(STUDY, tmp_path)
    study_file = tmp_path / "mae_runs" / "mask_ratio-smoke" / "study.json"
    wait_for(study_file.exists, driver, "the parent run")  # written before Ray starts
    output = interrupt(driver, signal.SIGINT)
    command = check_interrupted_study(tmp_path, output, driver, "SIGINT")
    assert not query(tmp_path / "mae_runs" / "mlflow.db", "SELECT 1 FROM tags WHERE key = 'mlflow.parentRunId'")
    check_resumed_study(tmp_path, command)


def test_sigterm_during_a_trials_evaluation_kills_its_run_and_resume_finishes_the_grid(tmp_path):
    driver = start(STUDY, tmp_path, pause_in_evaluation=True)  # held there until the signal
    wait_for(lambda: in_evaluation(tmp_path / "mae_runs" / "mlflow.db", 60), driver, "a trial's evaluation")
    output = interrupt(driver, signal.SIGTERM)
    command = check_interrupted_study(tmp_path, output, driver, "SIGTERM")
    killed = [r for r in runs(f"sqlite:///{tmp_path}/mae_runs/mlflow.db")
              if "mlflow.parentRunId" in r.data.tags and r.info.status == "KILLED"]
    assert killed and all(r.data.tags["interrupted"] == "SIGTERM" for r in killed)
    check_resumed_study(tmp_path, command)


def _train_run(tmp_path: Path):
    [run] = runs(f"sqlite:///{tmp_path}/mlflow.db")
    return run


def test_sigint_during_training_checkpoints_that_step_and_resume_finishes(tmp_path):
    driver = start(TRAIN, tmp_path, pause_at_step=10)  # holds after logging step 10 until the signal
    wait_for(lambda: query(tmp_path / "mlflow.db", "SELECT 1 FROM metrics WHERE key = 'train_loss'"),
             driver, "the first train_loss")
    output = interrupt(driver, signal.SIGINT)
    assert driver.returncode == 130, output
    assert "interrupted by SIGINT after step" in output and "checkpoint is kept" in output
    run = _train_run(tmp_path)
    assert run.info.status == "KILLED" and run.data.tags["interrupted"] == "SIGINT"
    step = int(output.split("after step ")[1].split(";")[0])
    assert 10 <= step < 30 and step % 20  # stopped between the periodic checkpoints ...
    [checkpoint] = (tmp_path / "checkpoints").glob("*.pt")
    assert __import__("torch").load(checkpoint, weights_only=True)["step"] == step  # ... and saved it

    resumed = start(resume_command(output), tmp_path)
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    run = _train_run(tmp_path)  # the same run, finished
    assert run.info.status == "FINISHED" and run.data.tags["resumed_after"] == "SIGINT"
    assert "probe_linear_acc" in run.data.metrics
    steps = [m.step for m in MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_metric_history(
        run.info.run_id, "train_loss")]
    assert steps == list(range(10, 31, 10))


def test_sigterm_during_evaluation_of_train_is_recorded_and_resumed(tmp_path):
    driver = start(TRAIN, tmp_path, pause_in_evaluation=True)  # held there until the signal
    wait_for(lambda: in_evaluation(tmp_path / "mlflow.db", 30), driver, "the evaluation")
    output = interrupt(driver, signal.SIGTERM)
    assert driver.returncode == 130, output
    assert "interrupted by SIGTERM during evaluation" in output, output
    run = _train_run(tmp_path)
    assert run.info.status == "KILLED" and run.data.tags["interrupted"] == "SIGTERM"
    resumed = start(resume_command(output), tmp_path)
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    assert _train_run(tmp_path).info.status == "FINISHED"


SEQUENTIAL = """\
name: looks
base: {dataset: digits, steps: 30}
axes: {mask_ratio: [0.5, 0.75]}
seeds: [0, 1]
reference: {mask_ratio: 0.75}
claims:
  - {name: half_masked_linear, metric: probe_linear_acc, kind: vs_reference, delta: 0.0001}
"""


def test_sigterm_between_looks_ends_the_parent_killed_and_resume_goes_on_looking(tmp_path):
    (tmp_path / "looks.yaml").write_text(SEQUENTIAL)
    command = ["run", "looks.yaml", "--smoke", "--until-decided", "--max-seeds", "3", "--seed-batch", "1"]
    driver = start(command, tmp_path, pause_between_looks=True)  # holds after its first look till the signal
    db = tmp_path / "mae_runs" / "mlflow.db"
    wait_for(lambda: query(db, "SELECT 1 FROM tags WHERE key = 'sequential_looks'"), driver, "the first look")
    output = interrupt(driver, signal.SIGTERM)
    assert driver.returncode == 130 and "interrupted by SIGTERM" in output, output
    uri = f"sqlite:///{tmp_path}/mae_runs/mlflow.db"
    [parent] = [r for r in runs(uri) if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "KILLED" and parent.data.tags["interrupted"] == "SIGTERM"
    state = json.loads((tmp_path / "mae_runs" / "looks-smoke" / "study.json").read_text())
    assert state["complete"] is False and state["interrupted"] == "SIGTERM"

    resumed = start(resume_command(output), tmp_path)
    output, _ = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, output
    [parent] = [r for r in runs(uri) if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FINISHED" and parent.data.tags["resumed_after"] == "SIGTERM"
    looks = json.loads(parent.data.tags["sequential_looks"])
    assert looks[0] == {"mask_ratio=0.5": 2, "mask_ratio=0.75": 2}  # the first look, recorded once
    assert all(a != b for a, b in zip(looks, looks[1:]))
    assert json.loads((tmp_path / "mae_runs" / "looks-smoke" / "study.json").read_text())["complete"] is True
