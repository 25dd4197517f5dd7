"""Declared claims and their four verdicts (analysis.claims): planted paired data decides as it
must, the family is one Holm family (statsmodels), TOST is statsmodels', and bad claims are
refused in one line."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import ttost_paired

from analysis.claims import MAX_SEEDS, check_claims, decide_claims, seeds_text
from analysis.claims_report import compare_claims, decide, write_claims
from analysis.stats import ALPHA
from studies.study_files import StudyFileError, load_study_file

AXES = {"mask_ratio": [0.25, 0.5, 0.75, 0.9]}
REFERENCE = {"mask_ratio": 0.75}
DELTA = 0.01


def planted(means: dict[float, float], sd: float, seeds: int = 8, seed: int = 0, shared_sd: float = 0.02,
            metric: str = "probe_linear_acc") -> pd.DataFrame:
    """A finished trial per (ratio, seed): ``metric`` = the cell's mean + a seed effect shared
    by every cell (which pairing removes) + independent noise of sd ``sd``."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, shared_sd, seeds)
    rows = [{"status": "FINISHED", "seed": s, "mask_ratio": ratio,
             metric: mean + shared[s] + rng.normal(0, sd)}
            for ratio, mean in means.items() for s in range(seeds)]
    return pd.DataFrame(rows)


def claims(*raw: dict) -> tuple[dict, ...]:
    return check_claims(list(raw), AXES, (), REFERENCE)


def one(frame: pd.DataFrame, **claim) -> pd.Series:
    table = decide_claims(frame, claims({"name": "c", "metric": "probe_linear_acc", **claim}))
    assert len(table) == 1
    return table.iloc[0]


def test_a_true_difference_of_three_deltas_with_small_spread_is_better():
    frame = planted({0.25: 0.90, 0.5: 0.90, 0.75: 0.90, 0.9: 0.90 + 3 * DELTA}, sd=0.002)
    row = one(frame, kind="vs_reference", cells=[{"mask_ratio": 0.9}])
    assert row["verdict"] == "better" and row["effect"] == pytest.approx(3 * DELTA, abs=0.004)
    assert row["ci_low"] > 0 and row["n_needed"] == row["n"] == 8 and row["outcome"] == "as declared"
    worse = one(frame, kind="vs_reference", cells=[{"mask_ratio": 0.9}], direction="worse")
    assert worse["verdict"] == "better" and worse["outcome"] == "against the declaration"


def test_zero_difference_with_small_spread_is_equivalent_and_with_large_spread_inconclusive():
    frame = planted({r: 0.90 for r in AXES["mask_ratio"]}, sd=0.001)
    row = one(frame, kind="vs_reference", cells=[{"mask_ratio": 0.5}])
    assert row["verdict"] == "equivalent" and -DELTA < row["ci_low"] < row["ci_high"] < DELTA
    noisy = planted({r: 0.90 for r in AXES["mask_ratio"]}, sd=0.05, seeds=5)
    row = one(noisy, kind="vs_reference", cells=[{"mask_ratio": 0.5}])
    assert row["verdict"] == "inconclusive" and row["outcome"] == "undecided"
    assert row["n_needed"] > row["n"]  # the seeds it would take, never "no effect"


def shaffer_by_hand(p_difference, p_equivalence):
    """The one family written out: all 2m p's sorted, the i-th multiplied by the number of
    hypotheses with a test at or after position i, then the running maximum."""
    tests = sorted((p, h) for h, pair in enumerate(zip(p_difference, p_equivalence)) for p in pair)
    adjusted, running = {}, 0.0
    for i, (p, h) in enumerate(tests):
        running = max(running, min(1.0, len({owner for _, owner in tests[i:]}) * p))
        adjusted.setdefault((p, h), running)
    return ([adjusted[(p, h)] for h, p in enumerate(p_difference)],
            [adjusted[(p, h)] for h, p in enumerate(p_equivalence)])


def test_the_family_is_every_test_of_every_claim_of_the_study_in_one_step_down():
    # Old rule (encoded here before #29): Holm over the difference tests and, separately, Holm
    # over the TOSTs, each at α: two families, 0.078 false verdicts for a nominal 0.05.
    frame = planted({0.25: 0.91, 0.5: 0.905, 0.75: 0.90, 0.9: 0.88}, sd=0.006, seeds=6)
    frame["probe_knn_acc"] = frame["probe_linear_acc"] - 0.02 + np.random.default_rng(1).normal(0, 0.01, len(frame))
    declared = claims({"name": "linear", "metric": "probe_linear_acc", "kind": "vs_reference"},
                      {"name": "knn", "metric": "probe_knn_acc", "kind": "vs_reference", "direction": "two-sided",
                       "cells": [{"mask_ratio": 0.25}]})
    table = decide_claims(frame, declared)
    assert len(table) == 4 and (table["family_size"] == 4).all()  # 3 cells + 1 cell, one family
    difference, equivalence = shaffer_by_hand(table["p"], table["p_equivalence"])
    assert table["p_adjusted"].to_numpy() == pytest.approx(difference)
    assert table["p_equivalence_adjusted"].to_numpy() == pytest.approx(equivalence)
    assert (table["p_adjusted"] >= multipletests(table["p"], method="holm")[1] - 1e-12).all()  # never laxer
    # the interval matches the decision: outside 0 for better/worse at 1 - α/k, inside ±delta at 1 - 2α/k
    for r in table.itertuples():
        if r.verdict in ("better", "worse"):
            assert r.ci_low > 0 or r.ci_high < 0
        elif r.verdict == "equivalent":
            assert -r.delta < r.ci_low < r.ci_high < r.delta
        else:
            assert r.ci_low <= 0 <= r.ci_high and not (-r.delta < r.ci_low and r.ci_high < r.delta)
    assert ((table["ci_level"] >= 1 - 2 * ALPHA / 4) & (table["ci_level"] < 1)).all()


def test_one_family_alone_is_holm_and_never_counts_a_hypothesis_twice():
    from analysis.claims import one_family

    rng = np.random.default_rng(5)
    p = rng.uniform(0, 0.1, 6) ** 2
    alone = one_family(p, np.full(6, np.nan))
    assert alone.difference == pytest.approx(multipletests(p, method="holm")[1])
    both = one_family(p, rng.uniform(0, 0.1, 6) ** 2)
    assert both.k_difference.max() <= 6 and both.k_equivalence.max() <= 6  # m, not 2m, at the first step


def test_tost_is_statsmodels_ttost_paired():
    frame = planted({0.25: 0.903, 0.5: 0.90, 0.75: 0.90, 0.9: 0.90}, sd=0.004, seeds=7)
    row = one(frame, kind="vs_reference", cells=[{"mask_ratio": 0.25}], delta=0.02)
    x = frame[frame["mask_ratio"] == 0.25].sort_values("seed")["probe_linear_acc"].to_numpy()
    r = frame[frame["mask_ratio"] == 0.75].sort_values("seed")["probe_linear_acc"].to_numpy()
    assert row["p_equivalence"] == pytest.approx(ttost_paired(x, r, -0.02, 0.02)[0])


def test_a_peak_that_loses_to_one_other_cell_is_not_better():
    frame = planted({0.25: 0.80, 0.5: 0.93, 0.75: 0.90, 0.9: 0.80}, sd=0.003)  # 0.5 beats the claimed peak
    row = one(frame, kind="peak", cell={"mask_ratio": 0.75})
    assert row["verdict"] == "worse" and row["reference"] == "mask_ratio=0.5"  # the cell that beats it
    clear = planted({0.25: 0.80, 0.5: 0.86, 0.75: 0.90, 0.9: 0.80}, sd=0.003)
    assert one(clear, kind="peak", cell={"mask_ratio": 0.75})["verdict"] == "better"


def test_a_trend_needs_every_step():
    rising = planted({0.25: 0.80, 0.5: 0.84, 0.75: 0.88, 0.9: 0.92}, sd=0.003)
    assert one(rising, kind="trend")["verdict"] == "better"
    stalled = planted({0.25: 0.80, 0.5: 0.84, 0.75: 0.84, 0.9: 0.92}, sd=0.02)
    row = one(stalled, kind="trend")
    assert row["verdict"] != "better" and row["cell"] == "mask_ratio=0.75"  # the weakest step


def test_a_trend_whose_steps_go_both_ways_needs_more_seeds_than_any_study_runs():
    # The schedule study's shape (#25's run): up, down, up by more than delta at every step.
    # More seeds sharpen each step but cannot make them agree: no verdict at these effects.
    zigzag = planted({0.25: 0.92, 0.5: 0.93, 0.75: 0.91, 0.9: 0.94}, sd=0.003)
    row = one(zigzag, kind="trend")
    assert row["verdict"] == "inconclusive" and row["n_needed"] == MAX_SEEDS
    assert seeds_text(row["n_needed"]) == f"≥ {MAX_SEEDS}"
    # all one way but one step unclear: the seeds of the hardest step, which the weakest names
    slow = planted({0.25: 0.80, 0.5: 0.84, 0.75: 0.845, 0.9: 0.92}, sd=0.01, seeds=5)
    row = one(slow, kind="trend")
    assert row["verdict"] == "inconclusive" and row["cell"] == "mask_ratio=0.75"
    assert row["n"] < row["n_needed"] < MAX_SEEDS


def test_a_baseline_claim_pairs_within_each_run_and_risks_count_lower_as_better():
    frame = planted({r: 0.90 for r in AXES["mask_ratio"]}, sd=0.002)
    frame["random_probe_linear_acc"] = frame["probe_linear_acc"] - 0.05
    row = one(frame, kind="vs_baseline")  # the metric table's baseline: random init
    assert row["reference"] == "random_probe_linear_acc" and row["verdict"] == "better"
    risk = planted({r: 0.05 for r in AXES["mask_ratio"]}, sd=0.001, metric="test_mae_risk", shared_sd=0.001)
    risk["test_baseline_risk"] = risk["test_mae_risk"] + 0.05
    table = decide_claims(risk, claims({"name": "r", "metric": "test_mae_risk", "kind": "vs_baseline",
                                        "baseline": "test_baseline_risk", "delta": 0.005}))
    assert table.iloc[0]["verdict"] == "better" and table.iloc[0]["effect"] < 0


def test_the_mixed_model_and_sign_flip_stand_beside_every_verdict():
    frame = planted({0.25: 0.90, 0.5: 0.90, 0.75: 0.90, 0.9: 0.93}, sd=0.004, seeds=6)
    row = one(frame, kind="vs_reference", cells=[{"mask_ratio": 0.9}])
    assert row["model_effect"] == pytest.approx(row["effect"], abs=1e-6)  # balanced: the same estimate
    assert row["model_verdict"] == row["verdict"] and row["robust"] == "yes"
    d = (frame[frame["mask_ratio"] == 0.9].sort_values("seed")["probe_linear_acc"].to_numpy()
         - frame[frame["mask_ratio"] == 0.75].sort_values("seed")["probe_linear_acc"].to_numpy())
    flips = [abs(np.mean(d * np.array(s))) >= abs(d.mean()) - 1e-12 for s in itertools.product((1, -1), repeat=6)]
    assert row["signflip_p"] == pytest.approx(np.mean(flips))  # brute force over 2⁶ sign patterns
    five = planted({0.25: 0.90, 0.5: 0.90, 0.75: 0.90, 0.9: 0.93}, sd=0.004, seeds=5)
    # At five seeds the exact test cannot go below 2/2⁵ = 0.0625: the verdict rests on the t-test's
    # normality and says so; the seeds per cell an exact decision needs stand beside it.
    small = one(five, kind="vs_reference", cells=[{"mask_ratio": 0.9}])
    assert small["verdict"] == "better" and small["signflip_p"] == pytest.approx(0.0625)
    assert small["exact_agrees"] == "parametric" and small["n_exact_min"] == 6  # 2/2⁶ ≤ 0.05 (family of one)
    assert row["exact_agrees"] == "yes" and row["n_exact_min"] == 6


def test_the_mixed_model_tests_with_t_not_z_so_it_agrees_with_the_paired_test_at_small_n():
    # Two cells, five seeds, no missing pair: the model's contrast is the paired difference, its
    # df n - 1, so its p is the paired t-test's (a z test would make it about 2.5 times smaller).
    frame = planted({0.25: 0.90, 0.5: 0.90, 0.75: 0.90, 0.9: 0.905}, sd=0.004, seeds=5)
    row = one(frame, kind="vs_reference", cells=[{"mask_ratio": 0.9}])
    assert row["model_p_adjusted"] == pytest.approx(row["p_adjusted"], rel=1e-3)
    assert row["robust"] == "yes"


@pytest.mark.parametrize("claim, message", [
    ({"name": "a", "metric": "probe_linar_acc", "kind": "vs_reference"}, "claims[0].metric: unknown metric 'probe_linar_acc'"),
    ({"name": "a", "metric": "probe_linear_acc", "kind": "best"}, "claims[0].kind: Input should be"),
    ({"name": "a", "metric": "test_mae_risk", "kind": "vs_reference"}, "claims[0].delta: test_mae_risk has no default"),
    ({"name": "a", "metric": "probe_linear_acc", "kind": "peak"}, "claims[0].cell: required for a peak claim"),
    ({"name": "a", "metric": "probe_linear_acc", "kind": "vs_reference", "cells": [{"mask_ratio": 0.3}]},
     "claims[0].cells[0]: {'mask_ratio': 0.3} is not a cell"),
    ({"name": "a", "metric": "probe_linear_acc", "kind": "vs_baseline", "baseline": "probe_knn_acc"},
     "claims[0].baseline: 'probe_knn_acc' is not a baseline metric"),
    ({"name": "a", "metric": "probe_linear_acc", "kind": "trend", "colour": "red"}, "claims[0]: unknown key 'colour'"),
])
def test_a_bad_claim_is_one_line_naming_the_key(tmp_path, claim, message):
    with pytest.raises(ValueError) as error:
        check_claims([claim], AXES, (), REFERENCE)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_the_study_file_refuses_an_unknown_claim_metric_in_one_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("axes: {mask_ratio: [0.5, 0.75]}\nclaims:\n"
                    "  - {name: x, metric: no_such_metric, kind: vs_reference}\n")
    with pytest.raises(StudyFileError) as error:
        load_study_file(path)
    assert str(error.value).startswith(f"{path}: claims[0].metric: unknown metric 'no_such_metric'; allowed: ")
    assert "\n" not in str(error.value)


def test_the_cli_refuses_a_bad_claim_with_status_2_before_anything_runs(tmp_path, capsys):
    from studies.cli import main

    path = tmp_path / "s.yaml"
    path.write_text("axes: {mask_ratio: [0.5, 0.75]}\nclaims:\n  - {name: x, metric: probe_linear_acc, kind: peak}\n")
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(path), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "claims[0].cell: required for a peak claim" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "mlflow.db").exists()


def test_every_builtin_study_declares_claims_its_grid_can_decide():
    from studies.study_files import builtin_files

    for path in builtin_files():
        study = load_study_file(path)
        assert study.claims, f"{path.stem} declares no claim"
        assert check_claims(list(study.claims), study.grid_axes(), study.grid_zipped(), study.reference_cell())


def test_claims_files_and_the_comparison_of_two_reports(tmp_path):
    info = {"grid": {**AXES, "seed": list(range(8))}, "axes": ["mask_ratio"], "zip": [], "reference": REFERENCE}
    raw = [{"name": "peak", "metric": "probe_linear_acc", "kind": "peak", "cell": {"mask_ratio": 0.75}},
           {"name": "validated", "metric": "finetune_best_acc", "kind": "vs_baseline",
            "baseline": "scratch_best_finetune_acc"}]
    old = decide(planted({0.25: 0.80, 0.5: 0.84, 0.75: 0.90, 0.9: 0.80}, sd=0.003), "s", info, raw, "before the run")
    new = decide(planted({0.25: 0.80, 0.5: 0.93, 0.75: 0.90, 0.9: 0.80}, sd=0.003), "s", info, raw, "before the run")
    assert old.skipped == ["validated: not decided, these trials did not log finetune_best_acc"]
    paths, png = write_claims(new, "s", tmp_path)
    written = pd.read_csv(tmp_path / "claims.csv")
    assert list(written.columns[:14]) == ["study", "claim", "kind", "metric", "cell", "reference", "n", "effect",
                                          "ci_low", "ci_high", "p_adjusted", "delta", "verdict", "n_needed"]
    assert (tmp_path / "fig_claims.pdf").exists() and (tmp_path / "fig_claims_column.png").exists() and png
    assert "not decided, these trials did not log finetune_best_acc" in (tmp_path / "claims.md").read_text()
    lines = compare_claims(new.table, old.table)
    assert len(lines) == 1 and lines[0].startswith("peak (mask_ratio=0.75): better -> worse; n 8 -> 8")


def test_report_compare_prints_every_claim_whose_verdict_changed(tmp_path, capsys):
    import json

    from studies.cli import main
    from tests.test_report import SAMPLERS, _sampling_metrics, _study_store

    claims = [{"name": "block_worse", "metric": "probe_linear_acc", "kind": "vs_reference", "direction": "worse",
               "cells": [{"mask_sampling": "block"}]}]
    uri = _study_store(tmp_path, "mask_sampling", "mask_sampling", SAMPLERS,
                       {"reference": json.dumps({"mask_sampling": "random"}), "smoke": "False",
                        "claims": json.dumps(claims)}, _sampling_metrics)
    old = tmp_path / "old"
    old.mkdir()
    with pytest.raises(SystemExit) as exit_:  # checked before anything is written
        main(["report", "mask_sampling", "--tracking-uri", uri, "--report-dir", str(tmp_path / "new"),
              "--compare", str(old)])
    assert exit_.value.code == 2 and not (tmp_path / "new").exists()
    pd.DataFrame([{"claim": "block_worse", "cell": "mask_sampling=block", "n": 5, "effect": -0.01, "ci_low": -0.05,
                   "ci_high": 0.03, "verdict": "inconclusive"}]).to_csv(old / "claims.csv", index=False)
    capsys.readouterr()
    assert main(["report", "mask_sampling", "--tracking-uri", uri, "--report-dir", str(tmp_path / "new"),
                 "--format", "png", "--compare", str(old)]) == 0
    out = capsys.readouterr().out
    assert f"claims changed since {old}: 1" in out
    assert "block_worse (mask_sampling=block): inconclusive -> worse; n 5 -> 8; effect -0.01 [-0.05, +0.03] -> " in out


def test_partial_finetuning_share_is_measured_from_the_frozen_linear_probe():
    from analysis.partial_share import share_sentences, shares

    rows = [{"status": "FINISHED", "seed": s, "eval.finetune_blocks": b, "probe_linear_acc": 0.90 + 0.01 * s,
             "finetune_acc": 0.98 + 0.01 * s, "partial_finetune_acc": {"0": 0.85, "1": 0.94, "all": 0.98}[b] + 0.01 * s}
            for s in range(5) for b in ("0", "1", "all")]
    table = shares(pd.DataFrame(rows)).set_index("blocks")
    assert table.loc["1", "share"] == pytest.approx(0.5)  # (0.94 - 0.90) / (0.98 - 0.90)
    assert table.loc["0", "share"] == pytest.approx(-0.625)  # the head alone scores below the linear probe
    assert any(s.startswith("Tuning the last 1 block(s) recovers 50% [50%, 50%]") for s in share_sentences(pd.DataFrame(rows)))
