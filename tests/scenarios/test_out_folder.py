"""One output folder: a smoke ``run --out DIR`` leaves the MLflow store, its artifacts, Ray's
state and (after the printed next command) the report under DIR, and nothing in the working
folder; the store holds what MLflow's users look for (standard source tags, the data as inputs
with their digests, the encoder as a model, system metrics, summary metrics on the parent).

One smoke study runs for the whole module (two trials); each test reads what it left.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import mlflow
import mlflow.pytorch
import pytest
import torch
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_PARENT_RUN_ID, MLFLOW_SOURCE_NAME, MLFLOW_USER

from conftest import Command, run_cli
from mae_core import Config, prepare_data
from studies.run_artifacts import MODEL_ID_TAG, content_digest
from studies.named_studies import get_study
from studies.runner import plan_study

ARGS = ["mask_ratio", "--smoke", "seeds=0", "--out", "out"]


def cli(args: list[str], cwd: Path) -> Command:
    """The command in-process on the shared Ray: what is checked is where it writes, not how it starts."""
    return run_cli(args, cwd)


def pasted(line: str) -> list[str]:
    """A printed ``next: mae-study ...`` line as argv for this interpreter."""
    words = shlex.split(line.removeprefix("next:").strip())
    assert words[0] == "mae-study", line
    return words[1:]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    cwd = tmp_path_factory.mktemp("work")
    done = cli(["run", *ARGS], cwd)
    assert done.returncode == 0, done.stderr
    nexts = [line for line in done.stderr.splitlines() if line.startswith("next:")]
    assert len(nexts) == 1 and done.stderr.rstrip().endswith(nexts[0]), done.stderr
    out = cwd / "out"
    uri = f"sqlite:///{out}/mlflow.db"
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("mae-study").experiment_id])
    [parent] = [run for run in runs if MLFLOW_PARENT_RUN_ID not in run.data.tags]
    children = [run for run in runs if MLFLOW_PARENT_RUN_ID in run.data.tags]
    return {"cwd": cwd, "out": out, "uri": uri, "client": client, "parent": parent,
            "children": children, "next": nexts[0], "stderr": done.stderr}


def test_the_run_leaves_everything_under_out_and_nothing_in_the_working_folder(study):
    out = study["out"]
    assert sorted(p.name for p in study["cwd"].iterdir()) == ["out"]
    assert (out / "mlflow.db").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["mask_ratio-smoke", "mlartifacts", "mlflow.db"]
    folder = out / "mask_ratio-smoke"
    assert (folder / "study.json").is_file()
    [ray_state] = (folder / "ray").iterdir()  # Ray Tune's experiment state, for --resume
    assert any(ray_state.glob("experiment_state*.json")), list(ray_state.iterdir())
    artifacts = out / "mlartifacts" / "mae-study"
    for run in [study["parent"], *study["children"]]:
        assert (artifacts / run.info.run_id / "artifacts").is_dir()


def test_the_printed_next_command_works_when_pasted(study):
    parent_id = study["parent"].info.run_id
    assert study["next"] == f"next: mae-study report mask_ratio --out out --smoke --run {parent_id}"
    done = cli(pasted(study["next"]), study["cwd"])
    assert done.returncode == 0, done.stderr
    index = study["out"] / "mask_ratio-smoke" / "report" / "index.html"
    assert done.stdout.strip() == f"report: {index}"
    assert "(smoke run)</h1>" in index.read_text(encoding="utf-8")
    assert done.stderr.strip().splitlines()[-1] == (
        f"next: mlflow ui --backend-store-uri {study['uri']} --host 127.0.0.1")
    assert sorted(p.name for p in study["cwd"].iterdir()) == ["out"]


def test_report_refuses_a_smoke_run_unless_asked(study):
    done = cli(["report", "mask_ratio", "--out", "out"], study["cwd"])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"mae-study: error: study 'mask_ratio' has only smoke runs in {study['uri']}: pass --smoke to "
        "report one (its title says so), or run the full study first"]
    assert not (study["out"] / "mask_ratio").exists(), "a refused report leaves no folder"


def test_trial_runs_carry_the_source_tags_their_data_and_their_encoder(study):
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent).stdout.strip()
    plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={"seeds": "0"})
    data = prepare_data(Config(**plan.cells[0]))  # every cell reads the same split (seed 0)
    digests = {"train": content_digest(data.train_patches, data.train_labels),
               "test": content_digest(data.test_patches, data.test_labels)}
    assert len(study["children"]) == 2
    mlflow.set_tracking_uri(study["uri"])  # models:/ URIs are looked up in the current store
    for run in study["children"]:
        tags = run.data.tags
        assert tags[MLFLOW_SOURCE_NAME] == "mae-study" and tags[MLFLOW_USER]
        assert tags[MLFLOW_GIT_COMMIT] == head
        inputs = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset
                  for i in run.inputs.dataset_inputs}
        assert {context: d.digest for context, d in inputs.items()} == digests
        assert {d.name for d in inputs.values()} == {"digits"}
        assert any(key.startswith("system/cpu") for key in run.data.metrics), sorted(run.data.metrics)
        encoder = mlflow.pytorch.load_model(f"models:/{tags[MODEL_ID_TAG]}")
        with torch.no_grad():
            features = encoder(data.test_patches[:3])
        assert features.shape == (3, Config(**plan.cells[0]).encoder_width)
        assert torch.isfinite(features).all()


def test_the_parent_run_has_summary_metrics_and_the_cell_table(study):
    client, parent = study["client"], study["parent"]
    metrics = parent.data.metrics
    assert metrics["trials_finished"] == 2 and metrics["trials_failed"] == 0
    history = client.get_metric_history(parent.info.run_id, "cell_mean/probe_linear_acc")
    assert sorted(m.step for m in history) == [0, 1]  # one point per cell, in grid order
    by_ratio = {float(run.data.params["mask_ratio"]): run.data.metrics for run in study["children"]}
    assert metrics["reference/probe_linear_acc"] == by_ratio[0.75]["probe_linear_acc"]  # the default ratio
    assert "study_cells.json" in [a.path for a in client.list_artifacts(parent.info.run_id)]
