"""Statistics: per-cell summaries, paired comparisons with the reference and their verdicts,
Holm's correction, test-set uncertainty, and rank correlations within strata with a cluster
bootstrap."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis.stats import (
    baseline_comparisons,
    one_family,
    _kendall_rows,
    binomial_se,
    cluster_bootstrap_indices,
    correlation_reading,
    correlation_with_interval,
    detectable_difference,
    holm,
    paired_comparisons,
    rank_correlations,
    summarise,
    verdict,
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
    assert result["n"] == 40 and "spearman_p" not in result  # no p that treats trials as independent


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


# ------------------------------------------------------------- paired comparisons and verdicts


def _study(effects: dict[float, float], *, seeds: int, noise: float, rng, metric="probe_linear_acc",
           seed_sd: float = 0.05) -> pd.DataFrame:
    """Simulated trials: cell value = 0.8 + effect + a per-seed term shared by every cell (what
    pairing removes) + independent noise."""
    shared = rng.normal(0, seed_sd, size=seeds)
    rows = [{"status": "FINISHED", "mask_ratio": ratio, "seed": s,
             metric: 0.8 + effect + shared[s] + rng.normal(0, noise)}
            for ratio, effect in effects.items() for s in range(seeds)]
    return pd.DataFrame(rows)


def test_paired_comparison_recovers_a_planted_effect():
    rng = np.random.default_rng(7)
    frame = _study({0.5: 0.03, 0.75: 0.0, 0.9: -0.03}, seeds=10, noise=0.01, rng=rng)
    frame.loc[len(frame)] = {"status": "FAILED", "mask_ratio": 0.5, "seed": 10, "probe_linear_acc": np.nan}
    table = paired_comparisons(frame, ["mask_ratio"], {"mask_ratio": 0.75}, ["probe_linear_acc"])
    assert list(table["mask_ratio"]) == [0.5, 0.9] and list(table["n"]) == [10, 10]
    up, down = table.iloc[0], table.iloc[1]
    assert up["ci_low"] < 0.03 < up["ci_high"] and down["ci_low"] < -0.03 < down["ci_high"]
    assert up["mean_diff"] == pytest.approx(up["mean"] - up["reference_mean"])
    assert verdict(up) == "better"  # accuracy: higher is the better direction
    assert verdict(down) == "worse"
    assert verdict(down, "lower") == "better"  # where lower is better
    # pairing by seed: the shared per-seed term (sd 0.05) would swamp an unpaired comparison
    assert up["sd_diff"] < 0.03


def test_a_risk_is_better_lower():
    rng = np.random.default_rng(1)
    frame = _study({0.5: -0.05, 0.75: 0.0}, seeds=8, noise=0.01, rng=rng, metric="test_rec_risk")
    row = paired_comparisons(frame, ["mask_ratio"], {"mask_ratio": 0.75}, ["test_rec_risk"]).iloc[0]
    assert verdict(row) == "better"


def test_null_intervals_cover_zero_about_95_percent_of_the_time():
    rng = np.random.default_rng(2024)
    covered = []
    for _ in range(400):
        frame = _study({0.5: 0.0, 0.75: 0.0}, seeds=5, noise=0.02, rng=rng)
        row = paired_comparisons(frame, ["mask_ratio"], {"mask_ratio": 0.75}, ["probe_linear_acc"]).iloc[0]
        covered.append(row["ci_low"] <= 0 <= row["ci_high"])
    assert 0.92 <= np.mean(covered) <= 0.98


def _row(**numbers) -> dict:
    return {"metric": "probe_linear_acc", "n": 5, "mean_diff": 0.02, "p_holm": 0.01,
            "detectable_diff": 0.0123, **numbers}


def test_verdict_words_follow_from_the_numbers():
    # the declared claims' four words (#29: one vocabulary; "supported/contradicted/not resolved" before)
    assert verdict(_row()) == "better"
    assert verdict(_row(mean_diff=-0.02)) == "worse"
    assert verdict(_row(metric="test_mae_risk")) == "worse"  # a risk should fall
    assert verdict(_row(), "lower") == "worse"
    assert verdict(_row(p_holm=0.2)) == "inconclusive"
    assert verdict(_row(p_holm=0.05)) == "inconclusive"
    assert verdict(_row(n=1, p_holm=np.nan, detectable_diff=np.nan)) == "inconclusive"
    assert verdict(_row(p_holm=0.2, p_equivalence_holm=0.01)) == "equivalent"
    assert verdict(_row(p_equivalence_holm=0.01)) == "equivalent"  # shown within ±delta: checked first
    with pytest.raises(ValueError, match="direction"):
        verdict(_row(metric="not_a_metric"))


def test_holm_matches_a_hand_computation():
    p = [0.01, 0.04, 0.03, 0.005, np.nan]
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> 0.06 (monotone)
    assert holm(p)[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(holm(p)[4])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_the_hand_kept_holm_equals_statsmodels():
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(3)
    for size in (1, 2, 5, 17):
        p = rng.uniform(0, 0.2, size) ** 2
        assert holm(p) == pytest.approx(multipletests(p, method="holm")[1])
    assert np.isnan(holm([0.01, np.nan])[1]) and holm([0.01, np.nan])[0] == pytest.approx(0.01)


def test_one_alpha_and_one_power():
    """Only analysis/stats.py assigns ALPHA and POWER at module level; the claims, the sequential
    plan, the simulations and the report import them, so the level cannot drift apart."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    owners = {name: [] for name in ("ALPHA", "POWER")}
    for path in [*root.glob("analysis/**/*.py"), *root.glob("studies/**/*.py"), *root.glob("evaluation/**/*.py")]:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in owners:
                    owners[target.id].append(path.relative_to(root).as_posix())
    assert owners == {"ALPHA": ["analysis/stats.py"], "POWER": ["analysis/stats.py"]}


def test_holm_family_is_one_metric():
    rng = np.random.default_rng(3)
    frame = _study({0.25: 0.01, 0.5: 0.02, 0.75: 0.0, 0.9: 0.0}, seeds=6, noise=0.01, rng=rng)
    frame["probe_knn_acc"] = frame["probe_linear_acc"] + rng.normal(0, 0.01, len(frame))
    table = paired_comparisons(frame, ["mask_ratio"], {"mask_ratio": 0.75}, ["probe_linear_acc", "probe_knn_acc"])
    assert len(table) == 6
    for metric in ("probe_linear_acc", "probe_knn_acc"):
        family = table[table["metric"] == metric]
        # the difference tests and TOSTs of a metric are one family (the claims' rule), never laxer than Holm
        adjusted = one_family(family["p"].to_numpy(), family["p_equivalence"].to_numpy())
        assert family["p_holm"].to_numpy() == pytest.approx(adjusted.difference)
        assert family["p_equivalence_holm"].to_numpy() == pytest.approx(adjusted.equivalence)
        assert (family["p_holm"].to_numpy() >= holm(family["p"].to_numpy()) - 1e-12).all()
        expected = sps.ttest_rel(frame[frame["mask_ratio"] == 0.25][metric].to_numpy(),
                                 frame[frame["mask_ratio"] == 0.75][metric].to_numpy()).pvalue
        assert family.iloc[0]["p"] == pytest.approx(expected)


def test_detectable_difference_has_80_percent_power():
    rng = np.random.default_rng(5)
    for n in (3, 8):
        delta = detectable_difference(n, 1.0)
        samples = rng.normal(delta, 1.0, size=(20000, n))
        power = (sps.ttest_1samp(samples, 0.0, axis=1).pvalue < 0.05).mean()
        assert 0.78 <= power <= 0.82
    assert math.isnan(detectable_difference(1, 1.0)) and math.isnan(detectable_difference(4, 0.0))
    assert detectable_difference(400, 1.0) == pytest.approx(2.8 / 20, rel=0.02)  # the normal limit


def test_too_few_pairs_or_no_spread_resolve_nothing():
    frame = pd.DataFrame({"status": "FINISHED", "mask_ratio": [0.5, 0.5, 0.75, 0.75], "seed": [0, 1, 1, 2],
                          "probe_linear_acc": [0.9, 0.8, 0.7, 0.6]})
    row = paired_comparisons(frame, ["mask_ratio"], {"mask_ratio": 0.75}, ["probe_linear_acc"]).iloc[0]
    assert row["n"] == 1 and row["mean_diff"] == pytest.approx(0.1) and math.isnan(row["p_holm"])
    assert verdict(row) == "inconclusive"
    same = frame.assign(seed=[1, 2, 1, 2], probe_linear_acc=[0.8, 0.7, 0.7, 0.6])  # +0.1 on both seeds
    row = paired_comparisons(same, ["mask_ratio"], {"mask_ratio": 0.75}, ["probe_linear_acc"]).iloc[0]
    assert row["n"] == 2 and row["sd_diff"] == 0 and verdict(row) == "inconclusive"
    with pytest.raises(ValueError, match="every axis"):
        paired_comparisons(frame, ["mask_ratio"], {"decoder_depth": 2}, ["probe_linear_acc"])


# ---------------------------------------------------------------- binomial test-set uncertainty


def test_binomial_standard_error_beside_the_seed_spread():
    assert binomial_se(0.9, 100) == pytest.approx(0.03)
    assert math.isnan(binomial_se(0.9, 0))
    frame = _frame().assign(probe_linear_acc=[0.8, 0.9, 1.0, 0.5, np.nan, np.nan],
                            probe_test_size=[400.0, 400.0, 400.0, 100.0, np.nan, np.nan])
    summary = summarise(frame, ["mask_ratio"], ["probe_linear_acc", "risk"]).set_index("mask_ratio")
    assert summary.loc[0.5, "probe_linear_acc_binom_se"] == pytest.approx(math.sqrt(0.9 * 0.1 / 400))
    assert summary.loc[0.75, "probe_linear_acc_binom_se"] == pytest.approx(math.sqrt(0.25 / 100))
    assert math.isnan(summary.loc[0.9, "probe_linear_acc_binom_se"])
    assert "risk_binom_se" not in summary  # only accuracies are binomial


# ------------------------------------------------------------------ correlations done honestly


def test_correlation_refuses_fewer_than_ten_trials():
    x = np.arange(9.0)
    result = correlation_with_interval(x, -x)
    assert math.isnan(result["spearman_rho"]) and result["reason"] == "not enough trials: 9 of 10"
    result = correlation_with_interval(np.arange(10.0), -np.arange(10.0), n_boot=100)
    assert result["spearman_rho"] == pytest.approx(-1.0) and result["reason"] is None


def test_cluster_bootstrap_keeps_whole_cells_together():
    clusters = ["a"] * 3 + ["b"] * 3 + ["c"] * 2 + [None] * 2
    members = {label: [i for i, c in enumerate(clusters) if c == label] for label in dict.fromkeys(clusters)}
    samples = cluster_bootstrap_indices(clusters, 300, np.random.default_rng(0))
    assert len(samples) == 300
    for sample in samples:
        counts = np.bincount(sample, minlength=len(clusters))
        draws = [counts[idx] for idx in members.values()]
        assert all(len(set(c)) == 1 for c in draws), "a drawn cell brings all of its trials"
        assert sum(c[0] for c in draws) == len(members)  # as many cells drawn as there are
    assert any(len(set(s)) < len(clusters) for s in samples)  # it does resample


def test_correlations_stay_within_strata_where_the_risk_means_the_same():
    rng = np.random.default_rng(4)
    rows = []
    for ratio in (0.5, 0.75):  # mask_ratio changes the risk: two strata
        for depth in range(1, 11):  # decoder_depth does not: ten cells per stratum
            for seed in range(3):
                risk = 0.1 * depth + rng.normal(0, 0.01) + ratio
                rows.append({"status": "FINISHED", "mask_ratio": ratio, "decoder_depth": depth, "seed": seed,
                             "steps": 1000, "test_mae_risk": risk, "probe_linear_acc": 1 - risk / 2})
    frame = pd.DataFrame(rows)
    table = rank_correlations(frame, ["test_mae_risk"], ["probe_linear_acc"],
                              axes=["mask_ratio", "decoder_depth"], n_boot=200)
    assert list(table["stratum"]) == ["mask_ratio=0.5", "mask_ratio=0.75"]
    assert list(table["n"]) == [30, 30] and list(table["n_clusters"]) == [10, 10]
    assert table["spearman_rho"].to_numpy() == pytest.approx([-1.0, -1.0])
    # within one cell across seeds (3 trials) nothing is claimed
    one_cell = frame[(frame["decoder_depth"] == 1)]
    table = rank_correlations(one_cell, ["test_mae_risk"], ["probe_linear_acc"], axes=["mask_ratio", "decoder_depth"])
    assert table["spearman_rho"].isna().all() and (table["reason"] == "not enough trials: 3 of 10").all()
    assert "Too few" in correlation_reading(table)


def test_cells_that_differ_only_in_evaluation_are_not_correlated_as_separate_models():
    """partial_finetune's four cells evaluate one encoder per seed four ways: their risks and
    frozen probes repeat, and a cluster bootstrap over such cells has no spread (it claimed
    ρ = +0.30 [+0.30, +0.30]). Each evaluation setting is its own stratum: five encoders each."""
    rng = np.random.default_rng(5)
    encoders = [(0.06 + rng.normal(0, 0.002), 0.9 + rng.normal(0, 0.02)) for _ in range(5)]
    rows = [{"status": "FINISHED", "eval.finetune_blocks": blocks, "seed": seed, "steps": 1000,
             "test_mae_risk": risk, "probe_linear_acc": probe}
            for blocks in ("0", "1", "2", "all") for seed, (risk, probe) in enumerate(encoders)]
    table = rank_correlations(pd.DataFrame(rows), ["test_mae_risk"], ["probe_linear_acc"],
                              axes=["eval.finetune_blocks"], n_boot=200)
    assert list(table["stratum"]) == [f"eval.finetune_blocks={b}" for b in ("0", "1", "2", "all")]
    assert list(table["n"]) == [5] * 4 and table["spearman_rho"].isna().all()
    assert (table["reason"] == "not enough trials: 5 of 10").all()


def test_a_cluster_bootstrap_over_too_few_cells_claims_nothing():
    """Four cells allow only 35 distinct resamples (decoder_depth's kNN interval hugged its
    estimate: ρ = -0.497, CI [-0.501, +0.004]); fewer than ten clusters claim nothing."""
    x = np.arange(40.0)
    result = correlation_with_interval(x, -x, clusters=np.repeat(np.arange(4), 10))
    assert math.isnan(result["spearman_rho"]) and result["n_clusters"] == 4
    assert result["reason"].startswith("not enough trials: 4 of 10 independent clusters")
    result = correlation_with_interval(x, -x, clusters=np.repeat(np.arange(10), 4), n_boot=100)
    assert result["spearman_rho"] == pytest.approx(-1.0) and result["n_clusters"] == 10


def test_baseline_comparisons_pair_each_run_with_its_own_baselines():
    """A cell planted 0.05 above its runs' baseline is better, one planted 0.05 below is worse,
    one equal up to noise is equivalent within the metric's delta; pairs are within runs (seed by seed)."""
    rng = np.random.default_rng(0)
    rows = []
    for ratio, planted in ((0.25, 0.05), (0.5, -0.05), (0.75, 0.0)):
        for seed in range(6):
            base = 0.8 + rng.normal(0, 0.05)  # a large spread between seeds, shared by the pair
            rows.append({"status": "FINISHED", "seed": seed, "mask_ratio": ratio, "random_probe_linear_acc": base,
                         "probe_linear_acc": base + planted + rng.normal(0, 0.005)})
    rows.append({"status": "FAILED", "seed": 9, "mask_ratio": 0.25, "random_probe_linear_acc": 0.0,
                 "probe_linear_acc": 1.0})  # a failed run never counts
    table = baseline_comparisons(pd.DataFrame(rows), ["mask_ratio"],
                                 [("probe_linear_acc", "random_probe_linear_acc"), ("probe_linear_acc", "absent")])
    assert list(table["mask_ratio"]) == [0.25, 0.5, 0.75] and (table["n"] == 6).all()
    assert (table["baseline"] == "random_probe_linear_acc").all()
    verdicts = [verdict(row, "higher") for _, row in table.iterrows()]
    assert verdicts[:2] == ["better", "worse"] and verdicts[2] in ("equivalent", "inconclusive")
    assert table["mean_diff"].tolist() == pytest.approx([0.05, -0.05, 0.0], abs=0.01)
