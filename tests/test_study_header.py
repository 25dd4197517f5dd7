"""The study header (analysis.study_header): the parent run's tags written and read in one place,
byte for byte as the runner always wrote them, and the one choice of a study's parent run."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from analysis.trials_frame import ReportError, load_study_info
from analysis.study_header import STUDY_TAGS, StudyHeader, choose_parent, look_tags

# A smoke run's parent tags as the runner wrote them before the header existed (studies.runner
# _create_parent, commit 60c9134), with a search, claims and a sequential plan.
OLD_TAGS = {
    "study": "mask_ratio", "study_axes": '["mask_ratio"]', "grid": '{"mask_ratio": [0.5, 0.75], "seed": [0, 1]}',
    "smoke": "True", "ray_address": "local", "paper": "MAE Table 1 / Figure 5",
    "reference": '{"mask_ratio": 0.75}', "zip": '[{"lr": [0.001, 0.002], "steps": [10, 20]}]',
    "search": '{"algorithm": "random", "metric": "test_mae_risk", "mode": "min", "samples": 2, '
              '"space": {"lr": "1e-4..1e-2"}}',
    "claims": '[{"name":"c1","metric":"probe_linear_acc","kind":"peak","direction":"higher","delta":0.01}]',
    "sequential_plan": '{"alpha":0.05,"max_seeds":6}', "machine": "host (8 CPUs)",
    "command": "mae-study run mask_ratio --smoke", "workers_per_trial": "1", "gpus_per_trial": "0.5",
    "trials_per_gpu": "2", "claims_sha256": "ab" * 32, "study_file_commit": "uncommitted",
}


def test_tags_written_by_the_old_runner_read_and_write_back_byte_for_byte():
    header = StudyHeader.from_tags(OLD_TAGS)
    assert header.smoke and header.axes == ["mask_ratio"] and header.reference == {"mask_ratio": 0.75}
    assert header.search["samples"] == 2 and header.claims[0]["name"] == "c1"
    assert (header.workers_per_trial, header.gpus_per_trial, header.trials_per_gpu) == (1, 0.5, 2)
    assert header.to_tags() == OLD_TAGS


@pytest.mark.parametrize("header", [
    StudyHeader(study="lesson"),
    StudyHeader(study="decoder_depth", smoke=False, paper="", study_axes=["decoder_depth"],
                grid={"decoder_depth": [1, 8], "seed": [0]}, reference={"decoder_depth": 8},
                ray_address="127.0.0.1:6379", machine="m", workers_per_trial=2, gpus_per_trial=1),
    StudyHeader(study="looks", smoke=True, study_axes=[], sequential_plan={"alpha": 0.05},
                sequential_looks=[{"a": 2}, {"a": 4}], added_outside_plan=[5, 6]),
], ids=["bare", "grid", "looks"])
def test_to_tags_then_from_tags_is_the_same_header(header):
    tags = header.to_tags()
    assert all(isinstance(value, str) for value in tags.values())
    assert StudyHeader.from_tags(tags) == header


def test_an_older_store_without_the_later_tags_reads_as_before():
    # a parent from before study_axes, registration and the run-setting tags: axes from the grid
    header = StudyHeader.from_tags({"study": "s", "grid": '{"patch_size": [4, 8], "seed": [0]}', "smoke": "False"})
    assert header.axes == ["patch_size"] and not header.smoke and header.workers_per_trial is None
    info = header.to_json()
    assert "claims_sha256" not in info and info["sequential"] is None and info["reference"] is None
    unreadable = StudyHeader.from_tags({"study": "s", "study_axes": "{not json", "reference": "[1"})
    assert unreadable.study_axes is None and unreadable.reference is None


def test_the_evaluation_header_drops_the_axes_it_sets_and_the_claims():
    header = StudyHeader.from_tags(OLD_TAGS)
    assert header.without(["eval.fewshot"]) is header  # not an axis: the study as it ran
    evaluated = header.without(["mask_ratio"])
    assert evaluated.axes == [] and evaluated.grid == {"seed": [0, 1]} and evaluated.reference == {}
    assert "claims" not in evaluated.study_tags() and set(evaluated.study_tags()) <= set(STUDY_TAGS)


def test_a_look_records_its_verdicts_unless_they_are_too_long():
    assert look_tags([{"a": 2}], {"c1": "better"}) == {"sequential_looks": '[{"a":2}]', "look_1": '{"c1":"better"}'}
    assert set(look_tags([{"a": 2}], {f"c{i}": "inconclusive" * 10 for i in range(100)})) == {"sequential_looks"}


def _store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    return uri, client, client.create_experiment("mae-study", artifact_location=str(tmp_path / "artifacts"))


def _parent(client, experiment, start, smoke, **extra):
    tags = {**StudyHeader(study="lesson", smoke=smoke, study_axes=["mask_ratio"],
                          grid={"mask_ratio": [0.5], "seed": [0]}).to_tags(), **extra}
    parent = client.create_run(experiment, start_time=start, tags=tags).info.run_id
    client.create_run(experiment, tags={"study": "lesson", "mlflow.parentRunId": parent})
    return parent


def test_a_real_runs_header_and_the_report_header_agree(tmp_path):
    uri, client, experiment = _store(tmp_path)
    parent = client.create_run(experiment, start_time=1_000, run_name="mask_ratio-smoke-1", tags=OLD_TAGS)
    client.create_run(experiment, tags={"study": "mask_ratio", "mlflow.parentRunId": parent.info.run_id})
    header = StudyHeader.from_run(client.get_run(parent.info.run_id))
    assert (header.run_id, header.run_name, header.start_time) == (parent.info.run_id, "mask_ratio-smoke-1", 1_000)
    assert {k: v for k, v in header.to_tags().items()} == OLD_TAGS
    info = load_study_info(uri, "mask_ratio")
    assert info == header.to_json() and json.loads(json.dumps(info)) == info  # study.json as written
    assert info["sequential"] == {"plan": {"alpha": 0.05, "max_seeds": 6}, "looks": []}
    assert info["claims_sha256"] == "ab" * 32 and info["axes"] == ["mask_ratio"]


def test_the_study_is_its_newest_parent_of_the_kind_asked_for(tmp_path):
    uri, client, experiment = _store(tmp_path)
    full_old = _parent(client, experiment, 1_000, smoke=False)
    smoke = _parent(client, experiment, 2_000, smoke=True)
    full_new = _parent(client, experiment, 3_000, smoke=False)
    newest_smoke = _parent(client, experiment, 4_000, smoke=True)
    parents = [client.get_run(run_id) for run_id in (full_old, smoke, full_new, newest_smoke)]
    assert choose_parent(parents).info.run_id == newest_smoke
    assert choose_parent(parents, smoke=False).info.run_id == full_new
    assert choose_parent(parents, smoke=True).info.run_id == newest_smoke
    assert choose_parent(parents[:1], smoke=True) is None
    assert load_study_info(uri, "lesson", smoke=False)["run_id"] == full_new
    assert load_study_info(uri, "lesson", smoke=True)["run_id"] == newest_smoke


def test_a_report_refuses_a_run_of_the_other_kind_naming_the_flag(tmp_path):
    uri, client, experiment = _store(tmp_path)
    _parent(client, experiment, 1_000, smoke=True)
    with pytest.raises(ReportError, match="only smoke runs.*pass --smoke"):
        load_study_info(uri, "lesson", smoke=False)


def test_the_runner_writes_the_tags_it_always_wrote(tmp_path):
    from studies.planning import RunOptions, plan_study
    from studies.registration import registration_tags
    from studies.named_studies import get_study
    from studies.runner import study_header
    from studies import tracking

    plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={})
    options = RunOptions(out_dir=tmp_path, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                         command="mae-study run mask_ratio --smoke", gpus_per_trial=0.5)
    old = {  # studies.runner._create_parent before the header (commit 60c9134), its plan_tags inlined
        "study": plan.study.name, "study_axes": json.dumps(plan.varied[:-1]),
        "grid": json.dumps(plan.axes, default=str), "smoke": str(plan.study.is_smoke),
        "ray_address": options.address or "local", "paper": plan.study.paper,
        "reference": json.dumps(plan.reference, default=str),
        **({"claims": json.dumps(plan.study.claims, default=str, separators=(",", ":"))} if plan.study.claims else {}),
        "machine": tracking.machine(), "command": options.command,
        "workers_per_trial": str(options.workers_per_trial), "gpus_per_trial": f"{options.gpus_per_trial:g}",
        **registration_tags(plan.study),
    }
    assert study_header(plan, options).to_tags() == old
