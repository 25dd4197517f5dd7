"""``run --workers-per-trial 2`` (issue 26 part 5): each trial is a Ray Train TorchTrainer on two
gloo workers, with the contract of a one-process trial: one FINISHED MLflow child run per cell
(logged by rank 0 alone), its metrics, a study that completes; a study interrupted while its
trials train resumes with ``--resume`` and finishes every cell.
"""

from __future__ import annotations

import json
import signal

import pytest
from mlflow.tracking import MlflowClient

from test_interrupts import (check_interrupted_study, check_resumed_study, interrupt, query, runs, start,
                             wait_for)

pytestmark = pytest.mark.slow

STUDY = ["run", "mask_ratio", "--smoke", "seeds=0", "--workers-per-trial", "2"]  # 2 cells


def test_a_two_worker_study_logs_one_finished_child_run_per_cell(tmp_path):
    driver = start(STUDY, tmp_path)
    output, _ = driver.communicate(timeout=900)
    assert driver.returncode == 0, output
    recorded = runs(f"sqlite:///{tmp_path}/mae_runs/mlflow.db")
    [parent] = [r for r in recorded if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in recorded if "mlflow.parentRunId" in r.data.tags]
    assert parent.info.status == "FINISHED" and parent.data.tags["workers_per_trial"] == "2"
    assert len(children) == 2 and {r.info.status for r in children} == {"FINISHED"}
    assert len({r.data.tags["cell_id"] for r in children}) == 2
    for run in children:
        assert run.data.tags["workers_per_trial"] == "2"  # batch_size (a param) is the global batch
        assert {"train_loss", "test_mae_risk", "probe_linear_acc", "pixel_probe_linear_acc"} <= set(run.data.metrics)
    state = json.loads((tmp_path / "mae_runs" / "mask_ratio-smoke" / "study.json").read_text())
    assert state["complete"] is True


def test_a_two_worker_study_interrupted_while_training_resumes(tmp_path):
    # smoke: a checkpoint every 10 updates; the first trial holds at 20 so the signal lands in training
    driver = start([*STUDY, "steps=60"], tmp_path, pause_at_step=20)
    checkpoints = tmp_path / "mae_runs" / "mask_ratio-smoke" / "checkpoints"
    wait_for(lambda: any(checkpoints.glob("*/*/checkpoint.pt")), driver, "rank 0's first checkpoint", timeout=600)
    output = interrupt(driver, signal.SIGINT)
    command = check_interrupted_study(tmp_path, output, driver, "SIGINT")
    check_resumed_study(tmp_path, command)
    uri = f"sqlite:///{tmp_path}/mae_runs/mlflow.db"
    children = [r for r in runs(uri) if "mlflow.parentRunId" in r.data.tags]
    assert all(r.data.tags["workers_per_trial"] == "2" for r in children)
    assert any("resumed_from_step" in r.data.tags for r in children)  # continued from the checkpoint
    for run in children:  # the same run, each step logged once
        steps = [m.step for m in MlflowClient(uri).get_metric_history(run.info.run_id, "train_loss")]
        assert steps == list(range(10, 61, 10)), steps
