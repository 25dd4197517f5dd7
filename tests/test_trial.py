"""One trial end to end against a real MLflow store (no Ray): crash, damaged checkpoint, resume."""

from __future__ import annotations

import pytest
from conftest import tiny_config
from mlflow.tracking import MlflowClient

from mae_core import prepare_data
from studies.trial import run_trial


class Crash(Exception):
    """Stands in for the process dying right after a checkpoint."""


def test_truncated_checkpoint_falls_back_to_previous_with_a_warning_in_the_run(tmp_path):
    config = tiny_config(steps=30, checkpoint_every=10, log_every=5)
    data = prepare_data(config)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    checkpoint = tmp_path / "trial.pt"

    def crash_at_20(step, path):
        if step == 20:
            raise Crash

    with pytest.raises(Crash):
        run_trial(config, data, tracking_uri=uri, checkpoint_path=checkpoint, on_checkpoint=crash_at_20)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("mae-study").experiment_id])
    assert run.info.status == "KILLED"

    checkpoint.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])  # crash mid-write
    outcome = run_trial(config, data, tracking_uri=uri, checkpoint_path=checkpoint)

    assert outcome.run_id == run.info.run_id, "the same MLflow run was reopened"
    finished = client.get_run(outcome.run_id)
    assert finished.info.status == "FINISHED"
    assert "cannot be read" in finished.data.tags["checkpoint_warning"]
    assert finished.data.tags["resumed_from_step"] == "10"
    steps = [m.step for m in client.get_metric_history(outcome.run_id, "train_loss")]
    assert sorted(steps) == list(range(5, 31, 5)), "no step lost, none logged twice"


def test_a_trial_run_carries_the_standard_source_tags_and_logs_each_value_once(tmp_path):
    import subprocess
    from pathlib import Path

    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE, MLFLOW_USER

    from studies.tracking import user

    config = tiny_config(steps=4, **{"eval.finetune_steps": 2, "eval.finetune_shots": 2, "eval.finetune_blocks": 1})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    outcome = run_trial(config, prepare_data(config), tracking_uri=uri)
    run = MlflowClient(uri).get_run(outcome.run_id)

    tags = run.data.tags
    assert tags[MLFLOW_SOURCE_NAME] == "mae-study"
    assert tags[MLFLOW_SOURCE_TYPE] == "LOCAL"
    assert tags[MLFLOW_USER] == user() == run.info.user_id
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent).stdout.strip()
    assert tags[MLFLOW_GIT_COMMIT] == head
    assert "git_commit" not in tags, "the standard tag replaced the custom one"

    params, metrics = run.data.params, run.data.metrics
    assert not set(params) & set(metrics), "each value is logged once, as a param or as a metric"
    assert float(params["effective_mask_ratio"]) == config.effective_mask_ratio
    assert (params["eval.finetune_shots"], params["eval.finetune_blocks"]) == ("2", "1")
    assert "partial_finetune_acc" in metrics and "test_mae_risk" in metrics
