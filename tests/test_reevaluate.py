"""``mae-study evaluate``'s pieces (studies.reevaluate) without training: only eval.* keys, a trial's
own eval.* params read back, the evaluation parent's tags, and a report that reads the study's
training run unless the evaluation run is named."""

from __future__ import annotations

import json

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from analysis.trials_frame import load_runs
from mae_core import Config
from studies.reevaluate import EvaluateError, EvaluationPlan, Planned, config_with, eval_overrides, parent_tags


def test_only_eval_keys_may_change():
    assert eval_overrides(["eval.knn_ks=5,20", "eval.fewshot=2"]) == {"eval.knn_ks": "5,20", "eval.fewshot": "2"}
    with pytest.raises(EvaluateError, match="mask_ratio needs a new pretraining"):
        eval_overrides(["eval.fewshot=2", "mask_ratio=0.5"])


def test_a_trials_config_comes_back_with_its_own_eval_params_and_the_new_keys():
    trained = Config(mask_ratio=0.5, seed=3, **{"eval.fewshot": 2})  # the run whose checkpoint is read
    reused = Config(mask_ratio=0.5, seed=3, **{"eval.finetune_steps": 4, "eval.finetune_blocks": "all",
                                               "eval.linear_cs": "0.1,10", "eval.finetune_shots": None})
    params = {key: str(value) for key, value in reused.resolved().items()}  # as MLflow holds them
    back = config_with(trained.resolved(), params, {"eval.knn_ks": "3,7"})
    assert back.eval == reused.eval.model_copy(update={"knn_ks": (3, 7)})
    assert (back.mask_ratio, back.seed) == (0.5, 3)


def test_an_axis_the_evaluation_sets_is_no_longer_an_axis(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("mae-study", artifact_location=str(tmp_path / "artifacts"))
    grid = {"eval.finetune_blocks": [0, "all"], "seed": [0, 1]}
    parent = client.create_run(experiment, tags={
        "study": "partial_finetune", "smoke": "True", "study_axes": json.dumps(["eval.finetune_blocks"]),
        "grid": json.dumps(grid), "reference": json.dumps({"eval.finetune_blocks": 0}), "claims": "[]"})
    trial = client.create_run(experiment, tags={"mlflow.parentRunId": parent.info.run_id})
    plan = EvaluationPlan(parent=client.get_run(parent.info.run_id), overrides={"eval.finetune_blocks": "1"},
                trials=[Planned(trial=trial, source=trial.info.run_id, checkpoint=tmp_path, config=Config())])
    tags = parent_tags(plan, "mae-study evaluate partial_finetune eval.finetune_blocks=1")
    assert tags["study"] == "partial_finetune" and tags["smoke"] == "True"
    assert tags["evaluation_of"] == parent.info.run_id and tags["evaluation"] == "eval.finetune_blocks=1"
    assert json.loads(tags["study_axes"]) == [] and json.loads(tags["grid"]) == {"seed": [0, 1]}
    assert json.loads(tags["reference"]) == {} and "claims" not in tags


def test_the_report_reads_the_training_run_unless_the_evaluation_run_is_named(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("mae-study", artifact_location=str(tmp_path / "artifacts"))
    parents = []
    for start, extra, knn in ((1_000, {}, 0.5), (2_000, {"evaluation_of": "x"}, 0.7)):  # the evaluation is newer
        parent = client.create_run(experiment, start_time=start, tags={
            "study": "lesson", "study_axes": json.dumps(["mask_ratio"]), **extra}).info.run_id
        run = client.create_run(experiment, tags={"study": "lesson", "mlflow.parentRunId": parent}).info.run_id
        params = [Param(k, str(v)) for k, v in Config(mask_ratio=0.5).resolved().items()]
        history = [Metric("train_loss", 0.3, 0, 10)] if not extra else []  # evaluate logs no history
        client.log_batch(run, metrics=[*history, Metric("probe_knn_acc", knn, 0, 1)], params=params)
        client.set_terminated(run, "FINISHED")
        parents.append(parent)
    trained = load_runs(uri, "lesson")
    assert trained["probe_knn_acc"].tolist() == [0.5] and trained["train_loss"].tolist() == [0.3]
    evaluated = load_runs(uri, "lesson", parent_run_id=parents[1])
    assert evaluated["probe_knn_acc"].tolist() == [0.7] and evaluated["train_loss"].isna().all()
