"""Studies: every built-in grid resolves; real Ray Tune sweeps logged to a real MLflow store."""

from __future__ import annotations


import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from mae_core import Config
from studies.named_studies import STUDIES, get_study
from studies.runner import RunOptions, plan_study, run_study
from studies.study import Study, cell_id

# The Fashion-MNIST twins of digits studies: each varies its digits namesake's axis on
# fashion_mask_ratio's data with its probes-only evaluation, so its smoke run end to end would
# repeat two runs the suite already makes (about 30 s each on two cores). Each is still planned
# on its own data (test_every_study_plans_its_smoke_run_on_its_own_data).
FASHION_TWINS = {"fashion_decoder_depth", "fashion_decoder_width", "fashion_mask_sampling", "fashion_mask_token",
                 "fashion_objectives", "fashion_target"}
# One smoke run end to end per distinct design.
END_TO_END = [name for name in STUDIES if name not in FASHION_TWINS]


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_study_grid_resolves(name):
    study = get_study(name)
    for grid in (study, study.smoke()):
        cells = grid.cells()
        assert len(cells) == grid.grid_size()
        assert len({cell_id(c) for c in cells}) == len(cells), "every cell is distinct"
        for cell in cells:
            Config(**cell)  # raises on a bad key or value
    assert study.paper and study.doc.strip(), "a study names the paper row it mirrors"
    smoke = study.smoke()
    assert smoke.is_smoke and smoke.smoke() is smoke and len(smoke.seeds) <= 2
    assert all(cell["steps"] == smoke.cells()[0]["steps"] for cell in smoke.cells()) or "steps" in smoke.axes


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_study_plans_its_smoke_run_on_its_own_data(name):
    # planning loads each dataset the cells name (a missing or refused one raises here)
    study = get_study(name)
    plan = plan_study(study, smoke=True, overrides={"seeds": "0"})
    assert plan.study.is_smoke and len(plan.cells) == len(study.smoke().cells(seeds=(0,)))
    assert {cell["dataset"] for cell in plan.cells} == {study.base.get("dataset", Config().dataset)}
    assert plan.axes == {**study.smoke().grid_axes(), "seed": [0]}


def test_only_the_fashion_twins_of_digits_studies_skip_the_end_to_end_run():
    assert FASHION_TWINS < set(STUDIES) and len(END_TO_END) == len(STUDIES) - len(FASHION_TWINS)
    demo = STUDIES["fashion_mask_ratio"].smoke().cells()[0]
    assert "fashion_mask_ratio" in END_TO_END
    for name in FASHION_TWINS:
        twin, namesake = STUDIES[name].smoke(), STUDIES[name.removeprefix("fashion_")].smoke()
        assert namesake.name in END_TO_END and twin.grid_axes().keys() == namesake.grid_axes().keys(), name
        for cell in twin.cells():  # outside its axis, every key as in the demo's run
            assert {k: v for k, v in cell.items() if k not in twin.grid_axes() and k != "seed"} \
                .items() <= demo.items(), name


def children(tracking_uri: str, parent_run_id: str):
    mlflow.set_tracking_uri(tracking_uri)
    return mlflow.search_runs(experiment_names=["mae-study"],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'")


def options(tmp_path, **kw) -> RunOptions:
    return RunOptions(out_dir=tmp_path / "study", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", **kw)


@pytest.mark.slow
@pytest.mark.parametrize("name", END_TO_END)
def test_every_design_runs_in_smoke_mode(tmp_path, local_ray, name):
    # one seed each keeps CI short; every design still runs end to end
    plan = plan_study(get_study(name), smoke=True, overrides={"seeds": "0"})
    out = tmp_path / name
    state = run_study(plan, options(out))
    assert state["errored"] == 0 and state["diverged"] == 0, name
    runs = children(f"sqlite:///{out}/mlflow.db", state["parent_run_id"])
    assert len(runs) == len(plan.cells), name
    assert set(runs["status"]) == {"FINISHED"}, name
    for metric in ("probe_linear_acc", "probe_knn_acc", "pixel_probe_linear_acc", "pixel_probe_knn_acc"):
        assert runs[f"metrics.{metric}"].notna().all(), (name, metric)
    if "risks" in plan.cells[0].get("eval.evaluators", "risks"):  # a study may evaluate its probes alone
        for metric in ("test_baseline_risk", "data_train_test_duplicates"):  # both logged by the risks evaluator
            assert runs[f"metrics.{metric}"].notna().all(), (name, metric)
        # R_rec for the AE/DAE; an MAE's all-visible error under its own name, never as a risk
        is_mae = runs["params.objective"] == "mae"
        for metric, present in (("test_rec_risk", ~is_mae), ("test_allvisible_rec_risk", is_mae)):
            column = runs.get(f"metrics.{metric}", pd.Series(float("nan"), index=runs.index))
            assert column[present].notna().all() and column[~present].isna().all(), (name, metric)
    else:
        assert "metrics.test_mae_risk" not in runs or runs["metrics.test_mae_risk"].isna().all(), name
    if name == "mask_ratio":
        assert runs["metrics.test_mae_risk"].notna().all()
        assert runs["metrics.scratch_best_finetune_acc"].notna().all()
        # both ratios at seed 0 share one set of baselines: computed once, read once
        assert sorted(runs["tags.baselines"].str.split().str[0]) == ["computed", "reused"]
        assert runs["tags.baselines"].str.split().str[1].nunique() == 1
        assert runs["metrics.random_finetune_acc"].nunique() == 1


@pytest.mark.slow
def test_diverging_trial_fails_alone(tmp_path, local_ray):
    study = Study(name="divergence", paper="test", base={"optimizer": "sgd", "steps": 20},
                  axes={"lr": [1e-3, 1e9]}, seeds=(0,), doc="One sane and one diverging trial.")
    plan = plan_study(study, smoke=True, overrides={})
    state = run_study(plan, options(tmp_path))
    assert state["errored"] == 0 and state["diverged"] == 1
    runs = children(f"sqlite:///{tmp_path}/mlflow.db", state["parent_run_id"])
    by_status = runs.set_index("status")
    assert sorted(runs["status"]) == ["FAILED", "FINISHED"]
    reason = by_status.loc["FAILED", "tags.failure_reason"]
    assert "non-finite" in reason and "step t=" in reason


@pytest.mark.slow
def test_asha_scheduler_runs_an_exploratory_sweep(tmp_path, local_ray):
    plan = plan_study(get_study("decoder_depth"), smoke=True, overrides={"seeds": "0,1", "steps": "40"})
    state = run_study(plan, options(tmp_path, scheduler="asha"))
    assert state["errored"] == 0
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    runs = children(uri, state["parent_run_id"])
    assert runs["tags.cell_id"].nunique() == len(runs) <= len(plan.cells)
    # ASHA (grace 10 of 40 updates, halving) stops the worse half at its first rung: those runs
    # end before their last update and are never evaluated; the best one runs to the end
    client = MlflowClient(uri)
    last_step = {run: max(m.step for m in client.get_metric_history(run, "train_loss")) for run in runs["run_id"]}
    stopped = runs[runs["run_id"].map(last_step) < 40]
    assert len(stopped) >= 1 and set(stopped["status"]) == {"KILLED"}, runs[["status", "run_id"]]
    assert stopped["metrics.probe_linear_acc"].isna().all() and stopped["tags.interrupted"].notna().all()
    finished = runs[runs["status"] == "FINISHED"]
    assert len(finished) >= 1 and (finished["run_id"].map(last_step) == 40).all()


def test_a_child_left_running_after_ray_tune_ends_is_recorded_killed(tmp_path):
    # Ray can end a stopped trial's process before the trial's own handler ends its run (seen
    # in CI under ASHA): the driver ends it KILLED, and leaves every ended run as it was.
    from studies.tracking import STOPPED_BY_RAY, end_stopped_children

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("e")
    parent = client.create_run(experiment).info.run_id
    other_parent = client.create_run(experiment).info.run_id
    child = {status: client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
             for status in ("RUNNING", "FINISHED", "FAILED")}
    stranger = client.create_run(experiment, tags={"mlflow.parentRunId": other_parent}).info.run_id
    for status in ("FINISHED", "FAILED"):
        client.set_terminated(child[status], status)
    assert end_stopped_children(client, parent) == [child["RUNNING"]]
    ended = client.get_run(child["RUNNING"])
    assert ended.info.status == "KILLED" and ended.data.tags["interrupted"] == STOPPED_BY_RAY
    assert [client.get_run(child[s]).info.status for s in ("FINISHED", "FAILED")] == ["FINISHED", "FAILED"]
    assert client.get_run(stranger).info.status == "RUNNING" and client.get_run(parent).info.status == "RUNNING"


def test_a_fresh_run_replaces_only_a_complete_study(tmp_path):
    from studies.runner import StudySetupError, check_resume, save_state

    plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={})
    state = {"study": "mask_ratio", "name": "mask_ratio-smoke-1", "cells": [], "ray_path": str(tmp_path)}
    save_state(tmp_path / "study", state)  # interrupted: the driver never marked it complete
    with pytest.raises(StudySetupError, match=r"unfinished study \(mask_ratio-smoke-1\).*--resume"):
        check_resume(plan, options(tmp_path))
    save_state(tmp_path / "study", {**state, "complete": False})  # ended with errored trials
    with pytest.raises(StudySetupError, match="unfinished"):
        check_resume(plan, options(tmp_path))
    save_state(tmp_path / "study", {**state, "complete": True})
    assert check_resume(plan, options(tmp_path)) is None
