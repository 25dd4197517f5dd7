"""Statistics: per-cell summaries and rank correlations with bootstrap intervals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis.stats import (
    _kendall_rows,
    correlation_reading,
    correlation_with_interval,
    rank_correlations,
    summarise,
)


def _frame() -> pd.DataFrame:
    return pd.DataFrame({
        "mask_ratio": [0.5, 0.5, 0.5, 0.75, 0.75, 0.9],
        "seed": [0, 1, 2, 0, 1, 0],
        "status": ["FINISHED", "FINISHED", "FINISHED", "FINISHED", "FAILED", "FAILED"],
        "failure_reason": [None, None, None, None, "diverged", "diverged"],
        "acc": [0.8, 0.9, 1.0, 0.5, np.nan, np.nan],
        "risk": [1.0, 2.0, np.nan, 4.0, np.nan, np.nan],
    })


def test_summarise_mean_std_n_and_failures():
    summary = summarise(_frame(), ["mask_ratio"], ["acc", "risk"]).set_index("mask_ratio")
    assert list(summary.index) == [0.5, 0.75, 0.9]
    half = summary.loc[0.5]
    assert half["acc_mean"] == pytest.approx(0.9) and half["acc_std"] == pytest.approx(0.1)
    assert (half["n"], half["acc_n"], half["risk_n"], half["n_failed"]) == (3, 3, 2, 0)
    assert half["risk_mean"] == pytest.approx(1.5)
    one = summary.loc[0.75]
    assert (one["n"], one["n_failed"], one["failure_reason"]) == (1, 1, "diverged")
    assert math.isnan(one["acc_std"])  # one run: no spread to state
    dead = summary.loc[0.9]  # every run failed: kept, not dropped
    assert (dead["n"], dead["n_failed"], dead["acc_n"]) == (0, 1, 0) and math.isnan(dead["acc_mean"])


def test_summarise_a_boolean_axis_with_and_without_failures():
    """A boolean axis (mask_token_in_encoder) must be aligned by label, not read as a mask."""
    frame = _frame().assign(mask_token_in_encoder=[False, False, True, True, True, True])
    summary = summarise(frame, ["mask_token_in_encoder"], ["acc"]).set_index("mask_token_in_encoder")
    assert summary.loc[True, "failure_reason"] == "diverged" and summary.loc[False, "failure_reason"] is None
    healthy = frame[frame["status"] == "FINISHED"]
    summary = summarise(healthy, ["mask_token_in_encoder"], ["acc"]).set_index("mask_token_in_encoder")
    assert list(summary["n"]) == [2, 2] and summary["failure_reason"].isna().all()


@pytest.mark.parametrize("sign", [1, -1])
def test_monotone_data_give_plus_or_minus_one(sign):
    x = np.arange(12.0)
    result = correlation_with_interval(x, sign * np.exp(x / 3), n_boot=200)
    assert result["spearman_rho"] == pytest.approx(sign) and result["kendall_tau"] == pytest.approx(sign)
    assert result["spearman_low"] == pytest.approx(sign) and result["spearman_high"] == pytest.approx(sign)


def test_independent_data_interval_contains_zero():
    rng = np.random.default_rng(0)
    result = correlation_with_interval(rng.normal(size=40), rng.normal(size=40), seed=1)
    assert result["spearman_low"] < 0 < result["spearman_high"]
    assert result["kendall_low"] < 0 < result["kendall_high"]
    assert result["n"] == 40 and 0 <= result["spearman_p"] <= 1


def test_vectorised_kendall_matches_scipy_with_ties():
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 4, size=(2, 5, 15)).astype(float)
    expected = [sps.kendalltau(a, b).statistic for a, b in zip(x, y)]
    assert _kendall_rows(x, y) == pytest.approx(expected)


def test_rank_correlations_table_and_reading():
    x = np.linspace(0, 1, 15)
    frame = pd.DataFrame({"status": "FINISHED", "test_mae_risk": x, "probe_linear_acc": 1 - x,
                          "probe_knn_acc": (x - 0.5) ** 2})  # U-shaped: no monotone relation
    table = rank_correlations(frame, ["test_mae_risk"], ["probe_linear_acc", "probe_knn_acc", "absent"], n_boot=300)
    assert list(table["downstream"]) == ["probe_linear_acc", "probe_knn_acc"]
    assert table.loc[0, "spearman_rho"] == pytest.approx(-1.0)
    reading = correlation_reading(table)
    assert reading.startswith("Across 15 trials")
    assert "Lower masked risk went with higher linear-probe accuracy" in reading
    assert "kNN accuracy the interval contains 0" in reading


def test_too_few_trials_say_so():
    frame = pd.DataFrame({"status": "FINISHED", "r": [1.0, 2.0], "a": [0.1, 0.2]})
    table = rank_correlations(frame, ["r"], ["a"])
    assert math.isnan(table.loc[0, "spearman_rho"])
    assert "Too few" in correlation_reading(table)
