"""``mae-study variance`` through real Ray Tune and MLflow on a smoke study: one component per
source and metric, each with an interval, in STUDY-smoke/variance/variance.csv; the design's
trials log their resolved seed_* params, and those that differ only in seed_eval share one
pretraining (the encoder trained once, as ``mae-study evaluate`` reuses a stored one)."""

from __future__ import annotations

import pandas as pd
from mlflow.tracking import MlflowClient

from analysis.variance import SOURCES
from conftest import run_cli

STUDY = """\
name: tiny_variance_case
base: {dataset: digits, encoder_width: 16, encoder_depth: 1, encoder_heads: 2, decoder_width: 8,
       decoder_depth: 1, decoder_heads: 2}
axes: {mask_ratio: [0.5, 0.75]}
seeds: [3, 4]
reference: {mask_ratio: 0.75}
"""


def test_variance_on_a_smoke_study_writes_one_component_per_source_with_an_interval(tmp_path):
    (tmp_path / "tiny_variance_case.yaml").write_text(STUDY)
    done = run_cli(["variance", "tiny_variance_case.yaml", "--smoke", "--levels", "2", "--cell", "mask_ratio=0.5"],
                   tmp_path)
    assert done.returncode == 0, done.stderr
    assert "next: mae-study report tiny_variance_case --smoke" in done.stderr

    table = pd.read_csv(tmp_path / "mae_runs" / "tiny_variance_case-smoke" / "variance" / "variance.csv")
    assert {"metric", "source", "variance", "ci_low", "ci_high", "levels", "n"} <= set(table.columns)
    assert "probe_linear_acc" in set(table["metric"]) and "test_mae_risk" in set(table["metric"])
    for _, rows in table.groupby("metric"):
        assert sorted(rows["source"]) == sorted(SOURCES)  # one component per source
    assert (table["levels"] == 2).all() and (table["n"] == 2).all()
    assert table[["variance", "ci_low", "ci_high"]].notna().all().all()
    assert ((table["ci_low"] <= table["variance"]) & (table["variance"] <= table["ci_high"])).all()
    assert (tmp_path / "mae_runs" / "tiny_variance_case-smoke" / "variance" / "fig_variance.png").is_file()
    advice = pd.read_csv(tmp_path / "mae_runs" / "tiny_variance_case-smoke" / "variance" / "variance_advice.csv")
    assert set(advice["metric"]) == set(table["metric"]) and (advice["pretrain_seconds"] > 0).all()

    client = MlflowClient(f"sqlite:///{tmp_path}/mae_runs/mlflow.db")
    experiment = client.get_experiment_by_name("mae-study").experiment_id
    children = client.search_runs([experiment], "tags.`mlflow.parentRunId` != ''")
    assert len(children) == 8 and {r.info.status for r in children} == {"FINISHED"}
    for run in children:  # the cell, its first seed, and each source resolved as a param
        params = run.data.params
        assert params["mask_ratio"] == "0.5" and params["seed"] == "3"
        assert sum(params[key] != "3" for key in SOURCES) == 1
    evaluated = [r for r in children if r.data.params["seed_eval"] != "3"]
    how = sorted(r.data.tags["pretraining"].split()[0] for r in evaluated)
    assert how == ["computed", "reused"], how
    assert evaluated[0].data.metrics["train_loss"] == evaluated[1].data.metrics["train_loss"]
