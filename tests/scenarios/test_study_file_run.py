"""A user's two-axis study file runs through real Ray Tune: one FINISHED MLflow run per cell,
the axis values logged as params, and the study's evaluation keys with them."""

from __future__ import annotations

import sys
import subprocess

import mlflow

STUDY = """\
name: depth_x_ratio
base: {dataset: digits}
axes: {decoder_depth: [1, 2], mask_ratio: [0.5, 0.75]}
seeds: [0]
eval: {knn_ks: [5]}
"""


def test_a_two_axis_study_file_runs_in_smoke_mode(tmp_path):
    (tmp_path / "depth_x_ratio.yaml").write_text(STUDY)
    done = subprocess.run([sys.executable, "-m", "studies.cli", "run", "depth_x_ratio.yaml", "--smoke"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mae_runs/mlflow.db")  # run's --out holds the store
    runs = mlflow.search_runs(experiment_names=["mae-study"], filter_string="tags.study = 'depth_x_ratio'")
    children = runs[runs["tags.mlflow.parentRunId"].notna()]
    assert len(children) == 4 and set(children["status"]) == {"FINISHED"}
    cells = set(zip(children["params.decoder_depth"], children["params.mask_ratio"]))
    assert cells == {("1", "0.5"), ("1", "0.75"), ("2", "0.5"), ("2", "0.75")}
    assert set(children["params.eval.knn_ks"]) == {"(5,)"}
