"""A user's two-axis study file runs through real Ray Tune: one FINISHED MLflow run per cell,
the axis values logged as params, and the study's evaluation keys with them."""

from __future__ import annotations

import mlflow
import pytest

from conftest import run_cli

STUDY = """\
name: depth_x_ratio
base: {dataset: digits}
axes: {decoder_depth: [1, 2], mask_ratio: [0.5, 0.75]}
seeds: [0]
eval: {knn_ks: [5]}
"""


def _run_smoke(tmp_path, study: str, text: str):
    """``run STUDY.yaml --smoke`` on the study file ``text``: every MLflow run of the study in the
    store it wrote under tmp_path/mae_runs, and its trials."""
    (tmp_path / f"{study}.yaml").write_text(text)
    done = run_cli(["run", f"{study}.yaml", "--smoke"], tmp_path)
    assert done.returncode == 0, done.stderr
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mae_runs/mlflow.db")  # run's --out holds the store
    runs = mlflow.search_runs(experiment_names=["mae-study"], filter_string=f"tags.study = '{study}'")
    return runs, runs[runs["tags.mlflow.parentRunId"].notna()]


def test_a_two_axis_study_file_runs_in_smoke_mode(tmp_path):
    runs, children = _run_smoke(tmp_path, "depth_x_ratio", STUDY)
    assert len(children) == 4 and set(children["status"]) == {"FINISHED"}
    cells = set(zip(children["params.decoder_depth"], children["params.mask_ratio"]))
    assert cells == {("1", "0.5"), ("1", "0.75"), ("2", "0.5"), ("2", "0.75")}
    assert set(children["params.eval.knn_ks"]) == {"(5,)"}


ZIPPED = """\
name: zipped_widths
base: {dataset: digits, encoder_depth: 1}
zip: {encoder_width: [16, 32], encoder_heads: [2, 4]}
seeds: [0]
"""


def test_a_zipped_study_file_runs_one_trial_per_row_and_reports_against_a_row(tmp_path):
    from studies.runner import plan_study
    from studies.study import cell_id
    from studies.study_files import load_study_file

    runs, children = _run_smoke(tmp_path, "zipped_widths", ZIPPED)
    assert len(children) == 2 and set(children["status"]) == {"FINISHED"}
    assert set(zip(children["params.encoder_width"], children["params.encoder_heads"])) == {("16", "2"), ("32", "4")}
    plan = plan_study(load_study_file(tmp_path / "zipped_widths.yaml"), smoke=True, overrides={})
    assert set(children["tags.cell_id"]) == {cell_id(cell) for cell in plan.cells}  # what --resume compares
    parent = runs[runs["tags.mlflow.parentRunId"].isna()].iloc[0]
    assert parent["tags.zip"] == '[{"encoder_width": [16, 32], "encoder_heads": [2, 4]}]'

    report = run_cli(["report", "zipped_widths", "--smoke", "--format", "png"], tmp_path)
    assert report.returncode == 0, report.stderr
    findings = (tmp_path / "mae_runs" / "zipped_widths-smoke" / "report" / "findings.md").read_text()
    assert "Reference row: encoder_width=16, encoder_heads=2" in findings  # a whole row, the first


TIMM_STUDY = """\
name: timm_ratio
base: {dataset: digits, encoder: "timm:vit_tiny_patch16_224", encoder_width: 16, encoder_depth: 1,
       encoder_heads: 2}
axes: {mask_ratio: [0.5, 0.75]}
seeds: [0]
"""


def test_a_timm_encoder_trains_in_a_smoke_study(tmp_path):
    # #27 part 3's done-when: encoder=timm:NAME through Ray Tune, one FINISHED child per cell.
    from conftest import timm_missing

    if timm_missing():
        pytest.skip(timm_missing())
    (tmp_path / "timm_ratio.yaml").write_text(TIMM_STUDY)
    done = run_cli(["run", "timm_ratio.yaml", "--smoke"], tmp_path)
    assert done.returncode == 0, done.stderr
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mae_runs/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["mae-study"], filter_string="tags.study = 'timm_ratio'")
    children = runs[runs["tags.mlflow.parentRunId"].notna()]
    assert len(children) == 2 and set(children["status"]) == {"FINISHED"}
    assert set(children["params.encoder"]) == {"timm:vit_tiny_patch16_224"}
    assert children["metrics.test_mae_risk"].notna().all() and children["metrics.probe_linear_acc"].notna().all()
