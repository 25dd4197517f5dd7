"""``mae-study train`` always checkpoints; ``--resume`` continues; an interrupted run is never overwritten.

Slow (real training runs with their evaluation): left out of ``make test-fast``.
"""

from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import timm_missing
from studies.cli import main

pytestmark = pytest.mark.slow

TINY = ["dataset=digits", "train_limit=64", "test_limit=32", "encoder_width=16", "encoder_depth=1",
        "decoder_width=8", "decoder_depth=1", "steps=20", "checkpoint_every=10", "log_every=5",
        "risk_exact_budget=2000"]


def train(*args: str, capsys) -> tuple[int, str]:
    try:
        status = main(["train", *TINY, *args])
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def checkpoint_file(out):
    (path,) = (out / "checkpoints").glob("*.pt")
    return path


def runs(out) -> list:
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mae-study")
    return client.search_runs([experiment.experiment_id], order_by=["attribute.start_time ASC"])


def test_train_checkpoints_without_being_asked(out, capsys):
    status, err = train(capsys=capsys)
    assert status == 0, err
    state = torch.load(checkpoint_file(out), weights_only=True)
    assert state["step"] == 20
    (run,) = runs(out)
    assert run.info.status == "FINISHED"
    assert state["extra"]["mlflow_run_id"] == run.info.run_id


def test_a_finished_run_is_trained_afresh_as_a_new_run(out, capsys):
    assert train(capsys=capsys)[0] == 0
    status, err = train(capsys=capsys)
    assert status == 0, err
    first, second = runs(out)
    assert first.info.run_id != second.info.run_id
    assert "resumed_from_step" not in second.data.tags
    assert torch.load(checkpoint_file(out), weights_only=True)["extra"]["mlflow_run_id"] == second.info.run_id


def interrupt_at_step_10(path) -> None:
    """Turn the finished checkpoint into the one an interrupted run leaves at step 10 (its .prev)."""
    prev = path.with_name(path.name + ".prev")
    state = torch.load(prev, weights_only=True)
    assert state["step"] == 10
    torch.save(state, path)
    prev.unlink()


def test_an_interrupted_run_is_refused_without_resume_and_continued_with_it(out, capsys):
    assert train(capsys=capsys)[0] == 0
    path = checkpoint_file(out)
    interrupt_at_step_10(path)
    before = path.read_bytes()

    status, err = train(capsys=capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1, err
    assert "interrupted run at step 10 of 20" in lines[0] and "--resume" in lines[0]
    assert path.read_bytes() == before, "the interrupted run's checkpoint is untouched"
    assert len(runs(out)) == 1, "no MLflow run is created for refused input"

    status, err = train("--resume", capsys=capsys)
    assert status == 0, err
    (run,) = runs(out)  # the checkpoint names its run, which is reopened
    assert run.data.tags["resumed_from_step"] == "10"
    assert torch.load(path, weights_only=True)["step"] == 20


def test_resume_without_a_checkpoint_is_bad_input(out, capsys):
    status, err = train("--resume", capsys=capsys)
    assert status == 2
    assert "--resume: no readable checkpoint" in err
    assert not (out / "mlflow.db").exists()


def test_smoke_json_is_one_object_on_stdout_from_the_defaults_file(out, capsys):
    """``config --yaml`` -> ``train --config FILE --smoke --json``: the file is read unchanged,
    the smoke keys beat it, key=value beats both, and stdout holds only the final metrics."""
    import json

    from studies.study import SMOKE

    assert main(["config", "--yaml"]) == 0
    (out / "defaults.yaml").write_text(capsys.readouterr().out)
    small = ["encoder_width=16", "encoder_depth=1", "decoder_width=8", "decoder_depth=1", "batch_size=16"]
    status = main(["train", "--config", "defaults.yaml", "--smoke", "--json", *small])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert len(captured.out.splitlines()) == 1, captured.out
    metrics = json.loads(captured.out)
    assert metrics["test_mae_risk"] > 0 and "probe_linear_acc" in metrics
    assert "train" in captured.err, "progress and the summary stay on stderr"
    (run,) = runs(out)
    assert run.info.run_name.startswith("smoke-")
    assert run.data.params["steps"] == str(SMOKE["steps"]) and run.data.params["encoder_width"] == "16"
    assert run.data.metrics["test_mae_risk"] == pytest.approx(metrics["test_mae_risk"])


def test_a_smoke_run_with_a_timm_encoder_trains_and_logs_its_probes(out, capsys):
    # #27 part 3: encoder=timm:NAME trains in smoke mode, and the probes read its features.
    if timm_missing():
        pytest.skip(timm_missing())
    status, err = mae_study_train("--smoke", "encoder=timm:vit_tiny_patch16_224", "encoder_width=16",
                                  "encoder_depth=1", "encoder_heads=2", "decoder_width=8", "decoder_depth=1",
                                  capsys=capsys)
    assert status == 0, err
    (run,) = runs(out)
    assert run.info.status == "FINISHED" and run.data.params["encoder"] == "timm:vit_tiny_patch16_224"
    assert "timm-vit_tiny_patch16_224" in run.data.tags["mlflow.runName"]
    for metric in ("test_mae_risk", "probe_linear_acc", "probe_knn_acc", "random_probe_linear_acc"):
        assert metric in run.data.metrics, metric


def mae_study_train(*args: str, capsys) -> tuple[int, str]:
    try:
        status = main(["train", "dataset=digits", *args])
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err
