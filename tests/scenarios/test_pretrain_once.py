"""Pretrain once, evaluate many, through real Ray Tune and the CLI: a study with an ``eval.*`` axis
trains one encoder per seed (``pretraining: computed``) that its other cells evaluate
(``reused``), and ``mae-study evaluate`` evaluates the stored encoders again without training."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from conftest import run_cli
from studies.cli import main

STUDY = """\
name: fewshot_share
base: {dataset: digits, encoder_width: 16, encoder_depth: 1, encoder_heads: 2, decoder_width: 8,
       decoder_depth: 1, decoder_heads: 2}
axes: {eval.fewshot: [2, 4]}
seeds: [0, 1]
"""
# what the few-shot setting does not touch: equal on one encoder
SAME_ENCODER = ("test_mae_risk", "probe_linear_acc", "probe_knn_acc", "random_probe_linear_acc")


def _runs(client: MlflowClient, parent: str):
    experiment = client.get_experiment_by_name("mae-study").experiment_id
    return client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent}'")


def _all_runs(client: MlflowClient):
    return client.search_runs([client.get_experiment_by_name("mae-study").experiment_id], "")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The smoke study run once: (its folder, client, parent run id, child runs)."""
    folder = tmp_path_factory.mktemp("share")
    (folder / "fewshot_share.yaml").write_text(STUDY)
    done = run_cli(["run", "fewshot_share.yaml", "--smoke"], folder)
    assert done.returncode == 0, done.stderr
    client = MlflowClient(f"sqlite:///{folder}/mae_runs/mlflow.db")
    (parent,) = [r for r in _all_runs(client) if "mlflow.parentRunId" not in r.data.tags]
    return folder, client, parent.info.run_id, _runs(client, parent.info.run_id)


def test_one_encoder_per_seed_is_trained_and_the_other_cell_evaluates_it(study):
    folder, client, _, children = study
    assert len(children) == 4 and {r.info.status for r in children} == {"FINISHED"}
    for seed in ("0", "1"):
        runs = {r.data.params["eval.fewshot"]: r for r in children if r.data.params["seed"] == seed}
        how = sorted(r.data.tags["pretraining"].split()[0] for r in runs.values())
        assert how == ["computed", "reused"], how
        keys = {r.data.tags["pretraining"].split()[1] for r in runs.values()}
        assert len(keys) == 1 and (folder / "mae_runs" / "fewshot_share-smoke" / "pretrained" / f"{keys.pop()}.pt").exists()
        computed, = [r for r in runs.values() if r.data.tags["pretraining"].startswith("computed")]
        reused, = [r for r in runs.values() if r.data.tags["pretraining"].startswith("reused")]
        assert reused.data.tags["pretraining_run"] == computed.info.run_id
        for metric in SAME_ENCODER:
            assert reused.data.metrics[metric] == computed.data.metrics[metric], metric
        history = [[(m.step, m.value) for m in client.get_metric_history(r.info.run_id, "train_loss")]
                   for r in (computed, reused)]
        assert history[0] == history[1] and len(history[0]) == 3  # smoke: 30 steps, logged every 10


def test_evaluate_makes_runs_without_training_that_a_report_can_read(study):
    from analysis.trials_frame import load_runs

    folder, client, parent, children = study
    done = run_cli(["evaluate", "fewshot_share", "--smoke", "eval.knn_ks=3,7"], folder)
    assert done.returncode == 0, done.stderr
    (evaluation,) = [r for r in _all_runs(client) if r.data.tags.get("evaluation_of") == parent]
    assert evaluation.info.status == "FINISHED" and evaluation.data.tags["study"] == "fewshot_share"
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"next: mae-study report fewshot_share --smoke --run {evaluation.info.run_id}"
    runs = _runs(client, evaluation.info.run_id)
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    trials = {r.info.run_id: r for r in children}
    for run in runs:
        assert client.get_metric_history(run.info.run_id, "train_loss") == []
        assert "train_seconds" not in run.data.metrics
        assert run.data.params["eval.knn_ks"] == "(3, 7)"
        trial = trials[run.data.tags["evaluated_run"]]
        # the encoder of the run that trained it (a reusing trial points there)
        assert run.data.tags["pretraining_run"] == trial.data.tags.get("pretraining_run", trial.info.run_id)
        for metric in ("test_mae_risk", "probe_linear_acc", "probe_fewshot_acc"):  # unchanged settings
            assert run.data.metrics[metric] == trial.data.metrics[metric], metric

    uri = f"sqlite:///{folder}/mae_runs/mlflow.db"
    frame = load_runs(uri, "fewshot_share", parent_run_id=evaluation.info.run_id, smoke=True)
    assert len(frame) == 4 and frame["train_loss"].isna().all() and frame["probe_knn_acc"].notna().all()
    assert set(load_runs(uri, "fewshot_share", smoke=True)["run_id"]) == set(trials)  # the default: the study's run


def test_evaluate_one_run_and_refuse_a_key_that_needs_training(study, capsys):
    folder, client, _, children = study
    out = str(folder / "mae_runs")
    before = len(_all_runs(client))
    try:
        main(["evaluate", "fewshot_share", "--smoke", "--out", out, "mask_ratio=0.5"])
    except SystemExit as exit_:
        assert exit_.code == 2
    else:
        pytest.fail("evaluate accepted mask_ratio")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mask_ratio" in err[0] and "eval.*" in err[0]
    assert len(_all_runs(client)) == before  # no run was created

    reused = next(r for r in children if r.data.tags["pretraining"].startswith("reused"))
    assert main(["evaluate", "--run", reused.info.run_id, "--out", out, "eval.fewshot=2"]) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("next: mae-study report fewshot_share")
    (parent,) = [r for r in _all_runs(client) if r.data.tags.get("evaluation") == "eval.fewshot=2"]
    (run,) = _runs(client, parent.info.run_id)
    assert run.data.tags["evaluated_run"] == reused.info.run_id
    assert run.data.tags["pretraining_run"] == reused.data.tags["pretraining_run"]
    assert run.data.params["eval.fewshot"] == "2" and "train_loss" not in run.data.metrics


LENGTHS = """\
name: lengths_share
base: {dataset: digits, encoder_width: 16, encoder_depth: 1, encoder_heads: 2, decoder_width: 8,
       decoder_depth: 1, decoder_heads: 2, schedule: constant, warmup_fraction: 0.0}
axes: {steps: [10, 20]}
smoke_axes: {steps: [10, 20]}
seeds: [0]
"""


def test_a_study_over_lengths_reads_the_shorter_one_from_the_longer_run(tmp_path):
    """A constant schedule: the 10-update trial is the 20-update run at update 10; the report says
    so, and ``evaluate`` reads that model, not the longer run's final one."""
    from analysis.trials_frame import load_runs
    from analysis.provenance import provenance

    (tmp_path / "lengths_share.yaml").write_text(LENGTHS)
    done = run_cli(["run", "lengths_share.yaml", "--smoke", "log_every=10"], tmp_path)
    assert done.returncode == 0, done.stderr
    client = MlflowClient(f"sqlite:///{tmp_path}/mae_runs/mlflow.db")
    (parent,) = [r for r in _all_runs(client) if "mlflow.parentRunId" not in r.data.tags]
    runs = {r.data.params["steps"]: r for r in _runs(client, parent.info.run_id)}
    assert runs["20"].data.tags["pretraining"].startswith("computed")
    assert runs["10"].data.tags["pretraining"].startswith("reused")
    assert runs["10"].data.tags["pretraining_run"] == runs["20"].info.run_id
    assert runs["10"].data.tags["pretraining_source_steps"] == "20"
    history = [[(m.step, m.value) for m in client.get_metric_history(runs[s].info.run_id, "train_loss")]
               for s in ("10", "20")]
    assert history[0] == history[1][:1] and len(history[1]) == 2

    uri = f"sqlite:///{tmp_path}/mae_runs/mlflow.db"
    frame = load_runs(uri, "lengths_share", smoke=True)
    info = {"run_id": parent.info.run_id, "smoke": True}
    rows = dict(provenance(uri, "lengths_share", info, frame).rows)
    assert rows["encoders"] == ("1 trained, 1 read from another trial's training; shorter lengths read at that "
                                "update of a longer run with the same learning rates: 10 of 20")

    done = run_cli(["evaluate", "--run", runs["10"].info.run_id, "eval.knn_ks=3"], tmp_path)
    assert done.returncode == 0, done.stderr
    (evaluation,) = [r for r in _all_runs(client) if r.data.tags.get("evaluated_run") == runs["10"].info.run_id]
    assert evaluation.data.tags["pretraining_run"] == runs["10"].info.run_id  # its own model, kept at update 10
    assert evaluation.data.metrics["test_mae_risk"] == runs["10"].data.metrics["test_mae_risk"]
