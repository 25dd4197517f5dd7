"""``mae-study variance`` without Ray: the design varies one source at a time, the components
and their chi-square intervals are the one-way design's, the report shows a variance.csv, and
bad input is one line with exit status 2 before anything runs (the design run through Ray is
tests/scenarios/test_variance_study.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.sections import variance_section as _variance_section
from analysis.variance import (COLUMNS, SOURCES, advice_text, claims_spend, components, design_rows,
                               repeats_advice, variance_design, write_variance)
from studies.cli import main


def test_the_design_varies_one_source_per_trial_over_its_levels():
    rows = pd.DataFrame(design_rows(seed=3, levels=4))
    assert len(rows) == 16 and not rows.duplicated().any()
    moved = (rows != 3).sum(axis=1)
    assert (moved == 1).all()  # every trial moves exactly one source away from the seed
    for source in SOURCES:
        assert sorted(rows.loc[rows[source] != 3, source]) == [4, 5, 6, 7]


def synthetic_frame(values: dict[str, list[float]], seed: int = 0) -> pd.DataFrame:
    """Design trials whose probe_linear_acc is ``values[source][level]``."""
    rows = []
    for source, metric_values in values.items():
        for level, value in enumerate(metric_values, start=1):
            row = {key: seed for key in SOURCES}
            row[source] = seed + level
            rows.append({**row, "status": "FINISHED", "probe_linear_acc": value})
    return pd.DataFrame(rows)


def test_each_source_gets_the_variance_of_its_levels_with_a_chi_square_interval():
    values = {"seed_data": [0.5, 0.6, 0.7], "seed_init": [0.55, 0.56, 0.57], "seed_masks": [0.6, 0.6, 0.6],
              "seed_eval": [0.4, 0.8, 0.6]}
    table = components(synthetic_frame(values), seed=0)
    assert list(table.columns) == COLUMNS and list(table["source"]) == list(SOURCES)
    for _, row in table.iterrows():
        expected = np.var(values[row["source"]], ddof=1)
        assert row["variance"] == pytest.approx(expected) and row["n"] == 3 and row["levels"] == 3
        assert row["ci_low"] == pytest.approx(2 * expected / stats.chi2.ppf(0.975, 2))
        assert row["ci_high"] == pytest.approx(2 * expected / stats.chi2.ppf(0.025, 2))
        assert row["ci_low"] <= row["variance"] <= row["ci_high"]
    assert table["share"].sum() == pytest.approx(1.0)
    assert table.set_index("source").loc["seed_eval", "share"] > 0.5  # the widest spread


def test_a_failed_trial_is_left_out_and_one_level_gives_no_interval():
    frame = synthetic_frame({"seed_data": [0.5, 0.7], "seed_init": [0.5], "seed_masks": [0.1, 0.2],
                             "seed_eval": [0.3, 0.3]})
    frame.loc[frame["seed_masks"] == 2, "status"] = "FAILED"
    table = components(frame, seed=0).set_index("source")
    assert table.loc["seed_masks", "n"] == 1 and np.isnan(table.loc["seed_masks", "variance"])
    assert np.isnan(table.loc["seed_init", "ci_high"])
    assert table.loc["seed_eval", "variance"] == 0.0


def test_the_report_shows_a_variance_csv_and_copies_it(tmp_path):
    table = components(synthetic_frame({s: [0.5, 0.6, 0.8] for s in SOURCES}), seed=0)
    write_variance(table, tmp_path / "variance")
    (tmp_path / "report").mkdir()
    section, copied = _variance_section(tmp_path / "variance", tmp_path / "report")
    assert "Where the noise comes from" in section and "seed_masks" in section and "<img" in section
    assert copied == ["variance.csv", "fig_variance.png"]
    assert pd.read_csv(tmp_path / "report" / "variance.csv").equals(pd.read_csv(tmp_path / "variance" / "variance.csv"))
    assert _variance_section(tmp_path / "nothing", tmp_path / "report") == ("", [])


@pytest.mark.parametrize("argv, says", [
    (["--levels", "1"], "--levels 1: at least 2"),
    (["--cell", "decoder_depth=2"], "--cell decoder_depth=...: not an axis of study mask_ratio"),
    (["--cell", "mask_ratio=0.33"], "is not a cell of study mask_ratio"),
])
def test_bad_input_is_one_line_before_anything_runs(tmp_path, capsys, argv, says):
    with pytest.raises(SystemExit) as stop:
        main(["variance", "mask_ratio", "--smoke", "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_repeats_pay_where_the_evaluation_holds_the_variance_and_pretraining_is_dear():
    frame = synthetic_frame({"seed_data": [0.50, 0.51], "seed_init": [0.50, 0.51], "seed_masks": [0.50, 0.51],
                             "seed_eval": [0.40, 0.60]})
    frame["probe_knn_acc"] = frame["probe_linear_acc"].where(frame["seed_eval"] == 0, 0.5)  # no eval noise
    table = components(frame, seed=0)
    advice = repeats_advice(table, pretrain_seconds=60.0, eval_seconds=5.0).set_index("metric")
    t, e = 3 * 0.00005, 0.02
    best = round(np.sqrt(e * 60 / (t * 5)))
    assert advice.loc["probe_linear_acc", "best_repeats"] == min(best, 50)
    ratio = (t + e / best) * (60 + best * 5) / ((t + e) * 65)
    assert advice.loc["probe_linear_acc", "seconds_ratio"] == pytest.approx(ratio) and ratio < 1
    assert advice.loc["probe_knn_acc", "best_repeats"] == 1  # seed_eval moves nothing: more seeds
    assert advice.loc["probe_knn_acc", "seconds_ratio"] == pytest.approx(1.0)
    words = advice_text(advice.reset_index())
    assert words[0].startswith("probe_linear_acc: eval.repeats") and "more seeds" in words[1]


def test_the_cell_is_the_reference_unless_named_and_one_flag_takes_several_axes():
    from studies.cli.parser import build_parser, parse
    from studies.cli.variance import chosen_cell
    from studies.study import Study

    study = Study(name="two", paper="", base={}, axes={"mask_ratio": [0.5, 0.75], "decoder_depth": [1, 2]},
                  reference={"mask_ratio": 0.75, "decoder_depth": 1})
    assert chosen_cell(study, []) == {"mask_ratio": 0.75, "decoder_depth": 1}
    assert chosen_cell(study, ["decoder_depth=2"]) == {"mask_ratio": 0.75, "decoder_depth": 2}
    args = parse(build_parser(), ["variance", "two", "--cell", "mask_ratio=0.5", "decoder_depth=2", "--levels", "3"])
    assert chosen_cell(study, args.cell) == {"mask_ratio": 0.5, "decoder_depth": 2} and args.levels == 3
    design = variance_design(study, chosen_cell(study, args.cell), 3)
    assert design.name == "two_variance" and design.base == {"mask_ratio": 0.5, "decoder_depth": 2}
    assert design.seeds == (0,) and design.axes == {} and len(design.cells()) == 12


def test_an_open_claim_is_priced_in_seeds_and_in_repeats(tmp_path):
    frame = synthetic_frame({"seed_data": [0.50, 0.51], "seed_init": [0.50, 0.51], "seed_masks": [0.50, 0.51],
                             "seed_eval": [0.40, 0.60]})
    advice = repeats_advice(components(frame, seed=0), pretrain_seconds=60.0, eval_seconds=5.0)
    claims = pd.DataFrame({"hypothesis": ["open", "decided", "unmeasured"],
                           "metric": ["probe_linear_acc", "probe_linear_acc", "finetune_acc"],
                           "n_needed": [40.0, 5.0, 30.0], "verdict": ["inconclusive", "better", "inconclusive"]})
    spend = claims_spend(claims, advice)
    assert spend["hypothesis"].tolist() == ["open"]  # decided: nothing to buy; finetune_acc: not measured
    row = advice.set_index("metric").loc["probe_linear_acc"]
    t, e, best = row["training_variance"], row["eval_variance"], int(row["best_repeats"])
    assert spend.loc[0, "n_needed_repeats"] == int(np.ceil(40 * (t + e / best) / (t + e)))
    assert spend.loc[0, "seconds_seeds"] == 40 * 65
    assert spend.loc[0, "seconds_repeats"] == spend.loc[0, "n_needed_repeats"] * (60 + best * 5)
    assert spend.loc[0, "seconds_repeats"] < spend.loc[0, "seconds_seeds"]  # repeats pay here
    write_variance(components(frame, seed=0), tmp_path / "variance", advice=advice)
    (tmp_path / "report").mkdir()
    section, copied = _variance_section(tmp_path / "variance", tmp_path / "report", claims)
    assert "What each open claim would cost" in section and "variance_claims.csv" in copied
    assert pd.read_csv(tmp_path / "report" / "variance_claims.csv")["n_needed"].tolist() == [40]
    no_repeats = advice.assign(best_repeats=1)  # at R* = 1 the seeds needed stay exactly n_needed
    assert claims_spend(claims.assign(n_needed=15.0), no_repeats)["n_needed_repeats"].tolist() == [15]
