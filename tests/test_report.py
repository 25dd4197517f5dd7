"""The report from a hand-made MLflow store: frame, tables, figures, index.html, errors.

The store mirrors what a study writes (a parent run tagged with the study and its axes, a child
run per trial with the resolved config as params), so no training is needed.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from analysis import figures
from analysis.trials_frame import ReportError, cast_param, load_history, load_runs, load_study_axes
from analysis.report import write_report
from mae_core import Config

RATIOS = (0.25, 0.5, 0.75)
SEEDS = (0, 1)
FAILED_CELL = (0.75, 1)
REASON = "non-finite loss at step t=3 (lr=0.001)"


def _metrics(ratio: float, seed: int) -> dict[str, float]:
    """Made-up final metrics: risk rises with the ratio, the probe falls with the risk."""
    risk = 0.02 + 0.04 * ratio + 0.001 * seed
    return {
        "test_mae_risk": risk, "test_mae_risk_stderr": 0.001, "test_baseline_risk": 0.12,
        # an MAE's all-visible error: made to track the probe, so a correlation would show up
        "test_allvisible_rec_risk": risk / 2, "probe_linear_acc": 0.95 - 2 * risk, "probe_fewshot_acc": 0.6 + 0.01 * seed,
        "probe_knn_acc": 0.7 - ratio / 10, "random_probe_linear_acc": 0.88,
        "random_probe_fewshot_acc": 0.55, "random_probe_knn_acc": 0.6, "pixel_probe_linear_acc": 0.96,
        "pixel_probe_fewshot_acc": 0.85, "pixel_probe_knn_acc": 0.98, "data_train_test_duplicates": 0.0,
        "train_seconds": 3.0 + seed, "pretrain_seconds": 3.0 + seed, "eval_seconds": 2.0,
        "flops_per_update": 1e6, "model_parameters": 5e4, "updates_per_second": 100.0,
        "probe_linear_acc_block1": 0.9 - 2 * risk,  # eval.probe_blocks=[1]
    }  # effective_mask_ratio is a param (Config.resolved()), as a trial logs it


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{folder}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("mae-study", artifact_location=str(folder / "artifacts"))
    parent = client.create_run(experiment, run_name="mask_ratio", tags={
        "study": "mask_ratio", "study_axes": json.dumps(["mask_ratio"]),
        "grid": json.dumps({"mask_ratio": list(RATIOS)})}).info.run_id
    for ratio in RATIOS:
        for seed in SEEDS:
            run = client.create_run(experiment, run_name=f"r{ratio}-s{seed}", tags={
                "study": "mask_ratio", "cell_id": f"cell{ratio}", "mlflow.parentRunId": parent}).info.run_id
            params = [Param(k, str(v)) for k, v in Config(mask_ratio=ratio, seed=seed).resolved().items()]
            history = [Metric("train_loss", 0.2 / step + ratio / 10, 0, step) for step in (10, 20, 30)]
            if (ratio, seed) == FAILED_CELL:
                client.log_batch(run, metrics=history[:1], params=params, tags=[RunTag("failure_reason", REASON)])
                client.set_terminated(run, "FAILED")
                continue
            finals = [Metric(k, v, 0, 30) for k, v in _metrics(ratio, seed).items()]
            client.log_batch(run, metrics=history + finals, params=params)
            client.set_terminated(run, "FINISHED")
    client.set_terminated(parent, "FINISHED")
    _all_failed_study(client, experiment)
    return uri


def _all_failed_study(client: MlflowClient, experiment: str) -> None:
    """A second study whose every trial diverged: its report must still say so."""
    parent = client.create_run(experiment, tags={"study": "decoder_depth",
                                                 "study_axes": json.dumps(["decoder_depth"])}).info.run_id
    for depth in (1, 2):
        run = client.create_run(experiment, tags={"study": "decoder_depth", "mlflow.parentRunId": parent}).info.run_id
        params = [Param(k, str(v)) for k, v in Config(decoder_depth=depth).resolved().items()]
        client.log_batch(run, metrics=[Metric("train_loss", 1.0, 0, 10)], params=params,
                         tags=[RunTag("failure_reason", REASON)])
        client.set_terminated(run, "FAILED")


@pytest.fixture(scope="module")
def frame(store) -> pd.DataFrame:
    return load_runs(store, "mask_ratio")


@pytest.fixture(scope="module")
def report(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return write_report("mask_ratio", store, out, formats=("png", "pdf"))


# ------------------------------------------------------------------------------ the frame


def test_frame_has_one_typed_row_per_trial(frame):
    assert len(frame) == len(RATIOS) * len(SEEDS)
    assert sorted(frame["status"].unique()) == ["FAILED", "FINISHED"]
    assert frame["seed"].dtype.kind == "i"
    assert frame["mask_ratio"].dtype.kind == "f" and frame["num_visible"].dtype.kind == "i"
    assert frame["class_token"].map(type).eq(bool).all()
    assert frame["train_limit"].isna().all()  # "None" came back as None
    failed = frame[frame["status"] == "FAILED"].iloc[0]
    assert failed["failure_reason"] == REASON and math.isnan(failed["probe_linear_acc"])
    assert frame["finetune_acc"].isna().all()  # an expected metric nobody logged is NaN, not absent


@pytest.mark.parametrize("key, text, value", [
    ("mask_ratio", "0.75", 0.75), ("steps", "1000", 1000), ("train_limit", "None", None),
    ("mask_token_in_encoder", "False", False), ("target", "raw", "raw"), ("num_visible", "4", 4),
    ("actual_lr", "0.001", 0.001), ("not_a_config_key", "7", 7),
    ("effective_mask_ratio", "0.75", 0.75), ("eval.finetune_shots", "4", 4), ("eval.finetune_lr", "0.001", 0.001),
])
def test_params_cast_back_to_their_config_types(key, text, value):
    cast = cast_param(key, text)
    assert cast == value and type(cast) is type(value)


def test_the_effective_ratio_is_read_from_the_params_and_shown_in_the_summary(store, frame, report):
    runs = MlflowClient(store).search_runs([MlflowClient(store).get_experiment_by_name("mae-study").experiment_id])
    assert not any("effective_mask_ratio" in run.data.metrics for run in runs), "a param, logged once"
    assert frame["effective_mask_ratio"].dtype.kind == "f"
    expected = [Config(mask_ratio=r).effective_mask_ratio for r in frame["mask_ratio"]]
    assert frame["effective_mask_ratio"].tolist() == expected
    summary = pd.read_csv(report.parent / "summary.csv")
    assert summary["effective_mask_ratio"].tolist() == [Config(mask_ratio=r).effective_mask_ratio for r in RATIOS]


def test_axes_and_history(store, frame):
    assert load_study_axes(store, "mask_ratio") == ["mask_ratio"]
    history = load_history(store, frame["run_id"].tolist())
    assert list(history.columns) == ["run_id", "step", "value"]
    assert len(history) == 5 * 3 + 1  # the failed run logged one step


def test_unknown_study_or_experiment_is_one_line_error(store, tmp_path):
    with pytest.raises(ReportError, match="no study 'nope'.*studies there: decoder_depth, mask_ratio"):
        load_runs(store, "nope")
    with pytest.raises(ReportError, match="no experiment"):
        load_runs(store, "mask_ratio", experiment="other")
    with pytest.raises(ReportError) as error:
        write_report("nope", store, tmp_path / "out")
    assert "\n" not in str(error.value)


def test_a_study_whose_every_trial_failed_still_reports(store, tmp_path):
    index = write_report("decoder_depth", store, tmp_path / "failed", formats=("png",))
    page = index.read_text(encoding="utf-8")
    assert page.count("FAILED ×1") >= 2 and "2 failed" in page
    summary = pd.read_csv(index.parent / "summary.csv")
    assert list(summary["n"]) == [0, 0] and list(summary["n_failed"]) == [1, 1]


def test_unwritable_out_dir_names_the_path(store, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReportError, match=str(blocker / "sub")):
        write_report("mask_ratio", store, blocker / "sub")


# ----------------------------------------------------------------------------- the report


def test_report_writes_every_file(report):
    out = report.parent
    names = {p.name for p in out.iterdir()}
    expected = {"index.html", "trials.csv", "summary.csv", "summary.md", "summary.tex", "correlations.csv",
                "correlations.md", "paper_table.tex"}
    for fig in ("risks", "probes", "risk_vs_probe", "training_curves"):  # both printed widths
        expected |= {f"fig_{fig}{size}.{fmt}" for fmt in ("png", "pdf") for size in ("", "_column")}
    assert expected <= names
    assert not any(name.startswith("fig_objectives") for name in names)  # only for objective studies
    # no trial was fine-tuned: MAE Figure 5's pair would be a copy of fig_probes
    assert not any(name.startswith("fig_probe_and_finetune") for name in names)


def test_trials_csv_is_the_frame_with_the_cell_first(report, frame):
    trials = pd.read_csv(report.parent / "trials.csv")
    assert list(trials.columns[:3]) == ["mask_ratio", "seed", "status"]
    assert len(trials) == len(frame) and set(trials.columns) == set(frame.columns)
    assert trials["probe_linear_acc"].tolist() == pytest.approx(frame["probe_linear_acc"].tolist(), nan_ok=True)


def test_summary_marks_the_failed_cell(report):
    out = report.parent
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["mask_ratio"]) == list(RATIOS)
    row = summary.set_index("mask_ratio").loc[0.75]
    assert (row["n"], row["n_failed"]) == (1, 1)
    assert summary.set_index("mask_ratio").loc[0.25, "probe_linear_acc_n"] == 2
    expected = np.mean([_metrics(0.25, s)["probe_linear_acc"] for s in SEEDS])
    assert summary.set_index("mask_ratio").loc[0.25, "probe_linear_acc_mean"] == pytest.approx(expected)
    markdown = (out / "summary.md").read_text(encoding="utf-8")
    assert "FAILED ×1" in markdown and REASON in markdown and " ± " in markdown
    latex = (out / "summary.tex").read_text(encoding="utf-8")
    assert r"\toprule" in latex and r"\bottomrule" in latex and r"$\pm$" in latex and r"mask\_ratio" in latex


def test_the_all_visible_error_is_a_column_but_never_a_risk(report, frame):
    out = report.parent
    summary = pd.read_csv(out / "summary.csv")
    for column in ("test_allvisible_rec_risk", "pixel_probe_linear_acc", "data_train_test_duplicates"):
        assert f"{column}_mean" in summary, column
    assert "test_rec_risk_mean" not in summary  # the MAE has no R_rec of its own
    correlations = pd.read_csv(out / "correlations.csv")
    assert set(correlations["risk"]) == {"test_mae_risk"}
    assert not set(correlations["downstream"]) & {"pixel_probe_linear_acc", "pixel_probe_knn_acc"}
    assert frame["scratch_best_finetune_acc"].isna().all()  # a final metric, NaN until logged
    fig = figures.metric_vs_axis(frame, "mask_ratio", ["test_allvisible_rec_risk"])
    try:
        assert "outside V_k" in fig.axes[0].get_ylabel()
    finally:
        figures.close(fig)


def test_compute_and_layer_probes_reach_the_summary_and_what_was_run(report):
    summary = pd.read_csv(report.parent / "summary.csv")
    for column in ("model_parameters", "flops_per_update", "updates_per_second", "pretrain_seconds",
                   "eval_seconds", "probe_linear_acc_block1"):
        assert f"{column}_mean" in summary, column
    # five finished trials: pretraining 3+4+3+4+3 s, evaluation 5 x 2 s, 5 x 1e6 FLOPs x 2000 updates
    assert "pretraining 17 s, evaluation 10 s (wall time summed over 5 trials); 1e+10 pretraining FLOPs" in \
        report.read_text(encoding="utf-8")


def test_index_is_self_contained(report):
    page = report.read_text(encoding="utf-8")
    assert "<table" in page and "probe_linear_acc" in page and "FAILED ×1" in page
    assert page.count('<img src="data:image/png;base64,') == 4  # no fine-tuning: no Figure 5 pair
    assert "mask_ratio" in page and "6 trials" in page and "SQLite file mlflow.db" in page
    assert "/tmp" not in page and "pytest-of" not in page  # provenance without temporary paths
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "Spearman" in (report.parent / "correlations.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------ figures


def test_metric_vs_axis_has_one_point_per_ratio(frame):
    fig = figures.metric_vs_axis(frame, "mask_ratio", ["test_mae_risk", "probe_linear_acc"])
    try:
        for ax in fig.axes:
            means = ax.containers[0].lines[0]  # the error bar's line through the cell means
            assert len(means.get_xdata()) == len(RATIOS)
            seeds = sum(len(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets")
                        and c.get_offsets().ndim == 2 and len(c.get_offsets()) and c.get_alpha() == 0.45)
            assert seeds == 5  # every finished trial a point
            assert "mask ratio" in ax.get_xlabel()
        assert fig.axes[0].get_ylabel() == "masked MSE (pixel² units)"
        assert fig.axes[1].get_ylabel() == "linear probe accuracy (%)"
        # x is the effective ratio (M-k)/M, not the nominal one
        assert list(fig.axes[0].containers[0].lines[0].get_xdata()) == sorted(frame["effective_mask_ratio"].unique())
        # accuracies in %: the mean of the 0.25 cell
        expected = 100 * np.mean([_metrics(0.25, s)["probe_linear_acc"] for s in SEEDS])
        assert fig.axes[1].containers[0].lines[0].get_ydata()[0] == pytest.approx(expected)
    finally:
        figures.close(fig)


def test_categorical_axis_is_a_point_plot(frame):
    data = frame.assign(decoder_depth=frame["mask_ratio"].map({0.25: 1, 0.5: 2, 0.75: 4}))
    fig = figures.metric_vs_axis(data, "decoder_depth", ["probe_knn_acc"])
    try:
        ax = fig.axes[0]
        assert len(ax.containers[0].lines[0].get_xdata()) == 3
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
    finally:
        figures.close(fig)


def test_probe_and_finetune_uses_knn_without_finetuning(frame):
    fig = figures.probe_and_finetune(frame, "mask_ratio")
    try:
        assert [ax.get_ylabel() for ax in fig.axes] == ["linear probe accuracy (%)", "kNN accuracy (%)"]
        with_ft = frame.assign(finetune_acc=frame["probe_linear_acc"] + 0.02)
        figures.close(fig)
        fig = figures.probe_and_finetune(with_ft, "mask_ratio")
        assert fig.axes[1].get_ylabel() == "fine-tuning accuracy (%)"
    finally:
        figures.close(fig)


def test_risk_vs_probe_has_a_point_per_finished_trial(frame):
    fig = figures.risk_vs_probe(frame, "test_mae_risk", "probe_linear_acc", "Spearman ρ = -1.00", hue="mask_ratio")
    try:
        ax = fig.axes[0]
        assert len(ax.collections[0].get_offsets()) == 5
        assert any("Spearman" in t.get_text() for t in ax.texts)
    finally:
        figures.close(fig)


def test_training_curves_one_line_per_cell(store, frame):
    history = load_history(store, frame["run_id"].tolist())
    fig = figures.training_curves(history, frame, hue="mask_ratio")
    try:
        ax = fig.axes[0]
        assert len([line for line in ax.lines if len(line.get_xdata()) == 3]) == len(RATIOS)
        assert ax.get_yscale() == "log"
    finally:
        figures.close(fig)


def test_objectives_comparison_has_a_panel_per_metric(frame):
    objectives = frame[frame["status"] == "FINISHED"].head(3).assign(objective=["ae", "dae", "mae"])
    fig = figures.objectives_comparison(objectives)
    try:  # one metric per panel (MAE Table 1), the objectives in Config's order, as words
        assert [" ".join(ax.get_ylabel().split()) for ax in fig.axes] == [  # wrapped to the panel's height
            "linear probe accuracy (%)", "few-shot probe accuracy (%)", "kNN accuracy (%)"]
        for ax in fig.axes:
            assert [t.get_text() for t in ax.get_xticklabels()] == ["MAE", "AE", "DAE"]
            assert len(ax.containers[0].lines[0].get_xdata()) == 3
    finally:
        figures.close(fig)


def test_save_figure_names_and_formats(frame, tmp_path):
    fig = figures.metric_vs_axis(frame, "mask_ratio", ["probe_knn_acc"])
    try:
        paths = figures.save_figure(fig, tmp_path, "knn", ("png", "svg"))
        assert [p.name for p in paths] == ["fig_knn.png", "fig_knn.svg"]
        first = paths[1].read_bytes()
        figures.save_figure(fig, tmp_path, "knn", ("svg",))
        assert paths[1].read_bytes() == first  # no timestamps: same figure, same file
        with pytest.raises(ValueError, match="jpg"):
            figures.save_figure(fig, tmp_path, "knn", ("jpg",))
    finally:
        figures.close(fig)


def test_an_older_run_of_a_study_is_reported_by_its_id(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("mae-study", artifact_location=str(tmp_path / "artifacts"))
    parents = []
    for start, ratio in ((1_000, 0.5), (2_000, 0.75)):  # the second run of the study is newer
        parent = client.create_run(experiment, start_time=start, tags={
            "study": "lesson", "study_axes": json.dumps(["mask_ratio"])}).info.run_id
        run = client.create_run(experiment, tags={"study": "lesson", "mlflow.parentRunId": parent}).info.run_id
        params = [Param(k, str(v)) for k, v in Config(mask_ratio=ratio).resolved().items()]
        client.log_batch(run, metrics=[Metric("test_mae_risk", ratio, 0, 1)], params=params)
        client.set_terminated(run, "FINISHED")
        parents.append(parent)
    assert load_runs(uri, "lesson")["mask_ratio"].tolist() == [0.75]
    assert load_runs(uri, "lesson", parent_run_id=parents[0])["mask_ratio"].tolist() == [0.5]
    with pytest.raises(ReportError, match="--run nope is not a run of study 'lesson'"):
        load_runs(uri, "lesson", parent_run_id="nope")


# ------------------------------------------------------------------------------- findings


def test_findings_compare_every_row_with_the_default_reference(report):
    """No reference tag: the cell at the Config defaults (mask_ratio 0.75) is the reference."""
    out = report.parent
    comparisons = pd.read_csv(out / "comparisons.csv")
    assert sorted(set(comparisons["mask_ratio"])) == [0.25, 0.5]
    # mask_ratio changes what the risk measures: only accuracies are compared
    assert set(comparisons["metric"]) == {"probe_linear_acc", "probe_fewshot_acc", "probe_knn_acc"}
    assert (comparisons["n"] == 1).all()  # the reference's seed 1 failed: one pair per row
    assert (comparisons["verdict"] == "inconclusive").all()  # the claims' words (#29), not "not resolved"
    page = report.read_text(encoding="utf-8")
    assert "<h2>Exploratory comparisons</h2>" in page and "Reference row: mask_ratio=0.75, the documented default" in page
    findings = (out / "findings.md").read_text(encoding="utf-8")
    assert findings.startswith("# mask_ratio: findings") and "exploratory, outside the family" in findings
    assert not re.search(r"supported|contradicted|not resolved", findings)
    # every cell against the baselines its own runs measured: random init and raw pixels
    assert "## Against the baselines" in findings and "| raw pixels |" in findings
    against = pd.read_csv(out / "baselines.csv")
    assert set(against["baseline"]) == {"random_probe_linear_acc", "random_probe_fewshot_acc", "random_probe_knn_acc",
                                        "pixel_probe_linear_acc", "pixel_probe_fewshot_acc", "pixel_probe_knn_acc"}
    assert set(against["mask_ratio"]) == {0.25, 0.5, 0.75}
    # the page shows them too, between the findings and the results, counted per baseline
    section = page.split("<h3>Against the baselines</h3>")[1].split("<h2>Results</h2>")[0]
    assert "against raw pixels: " in section and "<td>raw pixels</td>" in section
    counted = section.split("Verdicts over every row and metric, ")[1].split(".</p>")[0]
    assert sum(int(n) for n in re.findall(r"(\d+) (?:better|worse|equivalent|inconclusive)", counted)) == len(against)
    assert counted.count("inconclusive") <= 2  # counted once per baseline, whatever its n and difference
    assert section.count("<tr>") == len(against)  # one body row per comparison
    assert "href='baselines.csv'" in section
    assert "smoke" not in page.split("</h1>")[0]


SAMPLERS = ("block", "grid", "random")
PLANTED = {"block": -0.05, "grid": 0.0, "random": 0.0}  # linear-probe accuracy relative to random


def _sampling_metrics(sampler: str, seed: int, rng) -> dict[str, float]:
    shared = 0.02 * np.sin(seed)  # a per-seed term every cell shares: what pairing removes
    risk = 0.03 + 0.01 * (sampler == "block") + shared + rng.normal(0, 0.001)
    return {"test_mae_risk": risk, "test_baseline_risk": 0.12, "test_rec_risk": risk / 2,
            "probe_linear_acc": 0.8 + PLANTED[sampler] + shared + rng.normal(0, 0.005),
            "probe_knn_acc": 0.7 + shared + rng.normal(0, 0.005), "random_probe_linear_acc": 0.6,
            "random_probe_knn_acc": 0.5, "probe_test_size": 360.0}


def _study_store(folder, study: str, axis: str, values, tags: dict[str, str], metrics) -> str:
    uri = f"sqlite:///{folder}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("mae-study", artifact_location=str(folder / "artifacts"))
    parent = client.create_run(experiment, run_name=study, tags={
        "study": study, "study_axes": json.dumps([axis]),
        "grid": json.dumps({axis: list(values), "seed": list(range(8))}), **tags}).info.run_id
    rng = np.random.default_rng(0)
    for value in values:
        for seed in range(8):
            run = client.create_run(experiment, tags={"study": study, "mlflow.parentRunId": parent}).info.run_id
            params = [Param(k, str(v)) for k, v in Config(**{axis: value, "seed": seed}).resolved().items()]
            finals = [Metric(k, v, 0, 30) for k, v in metrics(value, seed, rng).items()]
            client.log_batch(run, metrics=finals, params=params)
            client.set_terminated(run, "FINISHED")
    client.set_terminated(parent, "FINISHED")
    return uri


def test_findings_use_the_reference_the_study_named(tmp_path):
    """The parent's reference tag names the row (here not the grid's first cell); 8 paired
    seeds find the planted drop of block masking and resolve nothing about grid masking."""
    claims = [{"name": "block_worse", "metric": "probe_linear_acc", "kind": "vs_reference", "direction": "worse",
               "cells": [{"mask_sampling": "block"}]}]
    uri = _study_store(tmp_path, "mask_sampling", "mask_sampling", SAMPLERS,
                       {"reference": json.dumps({"mask_sampling": "random"}), "smoke": "False",
                        "claims": json.dumps(claims)}, _sampling_metrics)
    index = write_report("mask_sampling", uri, tmp_path / "report", formats=("png",))
    # the declared claim, decided first on the page and in claims.csv; a parent without the
    # registration tags (claims_sha256, study_file_commit) vouches for nothing: after
    decided = pd.read_csv(index.parent / "claims.csv")
    assert list(decided[["claim", "cell", "reference", "verdict", "declared"]].itertuples(index=False, name=None)) == [
        ("block_worse", "mask_sampling=block", "mask_sampling=random", "worse", "after")]
    page_text = index.read_text(encoding="utf-8")
    assert page_text.index("Declared claims") < page_text.index("What was run") and 'id="claims"' in page_text
    comparisons = pd.read_csv(index.parent / "comparisons.csv").set_index(["mask_sampling", "metric"])
    assert sorted(set(comparisons.index.get_level_values(0))) == ["block", "grid"]
    block = comparisons.loc[("block", "probe_linear_acc")]
    assert block["n"] == 8 and block["ci_low"] < -0.05 < block["ci_high"]
    assert block["verdict"] == "worse" and block["claim"] == "higher"  # worse than the reference
    assert comparisons.loc[("block", "test_mae_risk"), "verdict"] == "worse"  # risks: same quantity here
    grid = comparisons.loc[("grid", "probe_linear_acc")]
    assert grid["verdict"] in ("equivalent", "inconclusive") and grid["detectable_diff"] < 0.05
    page = index.read_text(encoding="utf-8")
    assert "Reference row: mask_sampling=random, named by the study" in page and "exploratory, outside the family" in page
    assert "(test ±0.02" in page  # √(0.8·0.2/360) ≈ 0.021 beside the seed spread
    summary = pd.read_csv(index.parent / "summary.csv").set_index("mask_sampling")
    assert summary.loc["random", "probe_linear_acc_binom_se"] == pytest.approx(
        math.sqrt(summary.loc["random", "probe_linear_acc_mean"] * (1 - summary.loc["random", "probe_linear_acc_mean"]) / 360))
    correlations = pd.read_csv(index.parent / "correlations.csv")
    # one stratum (mask_sampling leaves the risk's meaning alone): 24 trials, but only 3 cells
    row = correlations[(correlations["risk"] == "test_mae_risk") & (correlations["downstream"] == "probe_linear_acc")].iloc[0]
    assert (row["n"], row["n_clusters"]) == (24, 3) and math.isnan(row["spearman_rho"])
    assert row["reason"].startswith("not enough trials: 3 of 10 independent clusters")


def test_a_smoke_report_claims_no_correlation_and_says_so(tmp_path):
    widths = (16, 32)
    uri = _study_store(tmp_path, "decoder_width", "decoder_width", widths, {"smoke": "True"},
                       lambda width, seed, rng: {"test_mae_risk": 0.05 - width / 1000 + rng.normal(0, 0.001),
                                                 "probe_linear_acc": 0.7 + width / 1000 + rng.normal(0, 0.005)})
    index = write_report("decoder_width", uri, tmp_path / "report", formats=("png",))
    page = index.read_text(encoding="utf-8")
    assert "<title>mae-study report: decoder_width (smoke run)</title>" in page
    assert "(smoke run)</h1>" in page and "Smoke run:" in page
    correlations = pd.read_csv(index.parent / "correlations.csv")
    assert len(correlations) and correlations["spearman_rho"].isna().all()
    assert (correlations["reason"] == "smoke run: no correlation claimed").all()
    assert "no Spearman or Kendall rank correlation is claimed" in (index.parent / "correlations.md").read_text()
    # no reference tag: the Config default decoder width (32) is the reference
    comparisons = pd.read_csv(index.parent / "comparisons.csv")
    assert list(comparisons["decoder_width"].unique()) == [16]
    assert (index.parent / "findings.md").read_text().startswith("# decoder_width (smoke run): findings")


def test_augmented_trials_are_marked_outside_the_procedure():
    from analysis.sections import outside_procedure_note

    assert outside_procedure_note(pd.DataFrame({"augment": ["none", "none"]})) == ""
    assert outside_procedure_note(pd.DataFrame({"mask_ratio": [0.5]})) == ""  # a store from before the key
    note = outside_procedure_note(pd.DataFrame({"augment": ["none", "crop_flip", "crop_flip"]}))
    assert "2 of 3 trials" in note and "augment=crop_flip" in note and "outside the specification" in note


def _full_and_smoke_store(folder) -> tuple[str, str, str]:
    """A study run in full, then in smoke mode (newer) into the same store: (uri, full, smoke)."""
    uri = f"sqlite:///{folder}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("mae-study", artifact_location=str(folder / "mlartifacts"))
    parents = []
    for start, smoke, ratio in ((1_000, "False", 0.5), (2_000, "True", 0.75)):
        parent = client.create_run(experiment, start_time=start, tags={
            "study": "lesson", "study_axes": json.dumps(["mask_ratio"]), "smoke": smoke}).info.run_id
        run = client.create_run(experiment, tags={"study": "lesson", "mlflow.parentRunId": parent}).info.run_id
        params = [Param(k, str(v)) for k, v in Config(mask_ratio=ratio).resolved().items()]
        client.log_batch(run, metrics=[Metric("test_mae_risk", ratio, 0, 1)], params=params)
        client.set_terminated(run, "FINISHED")
        parents.append(parent)
    return uri, parents[0], parents[1]


def test_a_report_never_takes_a_smoke_run_for_the_study_nor_the_reverse(tmp_path):
    uri, full, smoke = _full_and_smoke_store(tmp_path)
    assert load_runs(uri, "lesson")["mask_ratio"].tolist() == [0.75]  # the library's default: the newest
    assert load_runs(uri, "lesson", smoke=False)["mask_ratio"].tolist() == [0.5]  # the full run, though older
    assert load_runs(uri, "lesson", smoke=True)["mask_ratio"].tolist() == [0.75]
    with pytest.raises(ReportError, match=f"--run {smoke} is a smoke run of study 'lesson': pass --smoke"):
        load_runs(uri, "lesson", parent_run_id=smoke, smoke=False)
    with pytest.raises(ReportError, match=f"--run {full} is a full run of study 'lesson': drop --smoke"):
        load_runs(uri, "lesson", parent_run_id=full, smoke=True)
    index = write_report("lesson", uri, tmp_path / "smoke_report", formats=("png",), smoke=True)
    assert "(smoke run)</h1>" in index.read_text(encoding="utf-8")


def test_the_report_command_reads_the_out_folder_and_refuses_mixing_in_one_line(tmp_path, monkeypatch, capsys):
    from studies.cli import main

    out = tmp_path / "runs"
    out.mkdir()
    uri, full, smoke = _full_and_smoke_store(out)
    monkeypatch.chdir(tmp_path)

    def report(*args: str) -> tuple[int, str, str]:
        try:
            status = main(["report", "lesson", "--out", "runs", "--format", "png", *args])
        except SystemExit as exit_:
            status = exit_.code
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    status, _, err = report("--run", smoke)  # a smoke run named without --smoke
    assert status == 2 and err.strip() == (f"mae-study: error: --run {smoke} is a smoke run of study "
                                           "'lesson': pass --smoke to report it (its title says so)")
    assert not (out / "lesson").exists()
    status, stdout, err = report()  # the full run, into the study's folder under --out
    assert status == 0, err
    assert stdout.strip() == f"report: {(out / 'lesson' / 'report' / 'index.html').resolve()}"
    assert err.strip().splitlines()[-1] == f"next: mlflow ui --backend-store-uri {uri} --host 127.0.0.1"
    status, stdout, _ = report("--smoke", "--report-dir", "elsewhere")
    assert status == 0 and stdout.strip() == f"report: {(tmp_path / 'elsewhere' / 'index.html').resolve()}"
    assert "(smoke run)</h1>" in (tmp_path / "elsewhere" / "index.html").read_text(encoding="utf-8")


# --------------------------------------------------------------------- online evaluation


ONLINE_STEPS = (5, 10, 15)


def _online_store(folder) -> str:
    """A mask_ratio study whose trials logged eval.every's histories (two cells, two seeds)."""
    uri = f"sqlite:///{folder}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("mae-study", artifact_location=str(folder / "artifacts"))
    parent = client.create_run(experiment, tags={"study": "online", "study_axes": json.dumps(["mask_ratio"]),
                                                 "grid": json.dumps({"mask_ratio": [0.5, 0.75]})}).info.run_id
    for ratio in (0.5, 0.75):
        for seed in SEEDS:
            run = client.create_run(experiment, tags={"study": "online", "mlflow.parentRunId": parent}).info.run_id
            params = [Param(k, str(v)) for k, v in Config(mask_ratio=ratio, seed=seed).resolved().items()]
            online = [Metric(key, value, 0, step) for step in ONLINE_STEPS for key, value in (
                ("online_knn_acc", 0.5 + step / 100 - ratio / 10 + 0.01 * seed),
                ("online_mae_risk", 0.1 / step + ratio / 10))]
            finals = [Metric(k, v, 0, 15) for k, v in _metrics(ratio, seed).items()]
            client.log_batch(run, metrics=online + finals, params=params)
            client.set_terminated(run, "FINISHED")
    client.set_terminated(parent, "FINISHED")
    return uri


def test_online_curves_one_panel_per_metric_one_line_per_cell(tmp_path):
    from analysis.report_figures import load_online

    uri = _online_store(tmp_path)
    frame = load_runs(uri, "online")
    online = load_online(uri, frame["run_id"].tolist())
    assert len(online) == 2 * 2 * len(SEEDS) * len(ONLINE_STEPS)
    fig = figures.online_curves(online, frame, ["mask_ratio"])
    try:
        assert len(fig.axes) == 2  # one metric per panel
        assert [ax.get_ylabel().replace("\n", " ") for ax in fig.axes] == [
            "online kNN accuracy (%)", "online masked MSE (pixel² units)"]
        for ax in fig.axes:
            assert [len(line.get_xdata()) for line in ax.lines] == [len(ONLINE_STEPS)] * 2  # a line per cell
        knn = fig.axes[0].lines[0].get_ydata()  # ratio 0.5, mean over the two seeds, in %
        assert knn == pytest.approx([100 * (0.5 + s / 100 - 0.05 + 0.005) for s in ONLINE_STEPS])
    finally:
        figures.close(fig)


def test_the_report_draws_online_curves_only_when_a_run_logged_them(tmp_path, report):
    index = write_report("online", _online_store(tmp_path / "store"), tmp_path / "report", formats=("png",))
    names = {p.name for p in index.parent.iterdir()}
    assert {"fig_online.png", "fig_online_column.png"} <= names
    assert "Online evaluation" in index.read_text(encoding="utf-8")
    assert not any(p.name.startswith("fig_online") for p in report.parent.iterdir())  # no histories: no figure


def test_a_new_section_is_one_class_whose_part_and_file_reach_the_page(store, tmp_path):
    """A section computes, writes its files and returns its parts: one class in the list, and
    its part sits on the page in its place, its file linked under Files."""
    from analysis.page import Part
    from analysis.sections import SECTIONS, ReportContext

    class Seeds:
        def parts(self, context: ReportContext) -> list[Part]:
            path = context.out / "seeds.txt"
            path.write_text(" ".join(map(str, sorted(context.frame["seed"].unique()))))
            context.wrote(path)
            return [Part(f"<h2>Seeds</h2><p id='seeds'>{path.read_text()}</p>")]

    files = SECTIONS[-1]
    index = write_report("mask_ratio", store, tmp_path, formats=("png",), sections=[*SECTIONS[:-1], Seeds(), files])
    html = index.read_text(encoding="utf-8")
    assert "<p id='seeds'>0 1</p>" in html and '<a href="seeds.txt">' in html
    assert html.index("<h2>Every metric by cell</h2>") < html.index("<h2>Seeds</h2>") < html.index("<h2>Files</h2>")
    assert (tmp_path / "seeds.txt").read_text() == "0 1"
