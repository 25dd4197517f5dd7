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
