"""``run --workers-per-trial 2`` (issue 26 part 5): each trial is a Ray Train TorchTrainer on two
gloo workers, with the contract of a one-process trial. One test covers both halves of it (each
two-worker study costs a minute on two cores): a study interrupted while its trials train
resumes with ``--resume``, finishes every cell as one FINISHED MLflow child run (logged by rank 0
alone) with its metrics, and completes.
"""

from __future__ import annotations

import signal

import pytest
from mlflow.tracking import MlflowClient

from test_interrupts import (check_interrupted_study, check_resumed_study, interrupt, query, runs, start,
                             wait_for)

pytestmark = pytest.mark.slow

STUDY = ["run", "mask_ratio", "--smoke", "seeds=0", "--workers-per-trial", "2"]  # 2 cells


def test_a_two_worker_study_interrupted_while_training_resumes_to_one_finished_run_per_cell(tmp_path):
    # smoke: a checkpoint every 10 updates; the first trial holds at 20 so the signal lands in training
    driver = start([*STUDY, "steps=60"], tmp_path, pause_at_step=20)
    checkpoints = tmp_path / "mae_runs" / "mask_ratio-smoke" / "checkpoints"
    wait_for(lambda: any(checkpoints.glob("*/*/checkpoint.pt")), driver, "rank 0's first checkpoint", timeout=600)
    output = interrupt(driver, signal.SIGINT)
    command = check_interrupted_study(tmp_path, output, driver, "SIGINT")
    check_resumed_study(tmp_path, command)
    uri = f"sqlite:///{tmp_path}/mae_runs/mlflow.db"  # check_resumed_study: 2 FINISHED cells, study complete
    recorded = runs(uri)
    children = [r for r in recorded if "mlflow.parentRunId" in r.data.tags]
    parents = [r for r in recorded if "mlflow.parentRunId" not in r.data.tags]
    assert parents[-1].info.status == "FINISHED" and parents[-1].data.tags["workers_per_trial"] == "2"
    for run in children:  # batch_size (a param) is the global batch
        assert run.data.tags["workers_per_trial"] == "2"
        assert {"train_loss", "test_mae_risk", "probe_linear_acc", "pixel_probe_linear_acc"} <= set(run.data.metrics)
    assert any("resumed_from_step" in r.data.tags for r in children)  # continued from the checkpoint
    for run in children:  # the same run, each step logged once
        steps = [m.step for m in MlflowClient(uri).get_metric_history(run.info.run_id, "train_loss")]
        assert steps == list(range(10, 61, 10)), steps
