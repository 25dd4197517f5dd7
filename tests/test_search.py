"""Search: ranges typed against the config, the search a run asks for, its Ray Tune set-up, the
per-arm Optuna searcher, and the report's ranking (no Ray trials here: tests/scenarios runs them)."""

from __future__ import annotations

import builtins
import math

import pandas as pd
import pytest

from analysis.search import chosen_zip, search_ranking
from studies.cli import main
from studies.named_studies import get_study
from studies.runner import RunOptions, StudySetupError, check_resume, plan_study, save_state, tune_space
from studies.search import SearchError, check_space, is_range, make_search, parse_range, split_ranges

# (key, text) -> (kind, values)
GOOD_RANGES = [
    ("lr", "loguniform:1e-4:1e-2", "loguniform", (1e-4, 1e-2)),
    ("mask_ratio", "uniform:0.5:0.9", "uniform", (0.5, 0.9)),
    ("decoder_depth", "randint:1:4", "randint", (1, 4)),
    ("decoder_depth", "choice:1,2,4", "choice", (1, 2, 4)),
    ("target", "choice:raw,norm", "choice", ("raw", "norm")),
    ("eval.fewshot", "choice:4, 8", "choice", (4, 8)),
    ("weight_decay", "uniform:0:0.1", "uniform", (0.0, 0.1)),
]

# (key, text) -> words the one-line error must contain
BAD_RANGES = [
    ("lr", "loguniform:0:1e-2", "loguniform needs LOW > 0"),
    ("lr", "uniform:1e-2:1e-4", "needs LOW < HIGH"),
    ("lr", "loguniform:1e-4", "expected loguniform:LOW:HIGH"),
    ("lr", "uniform:a:b", "must be numbers"),
    ("decoder_depth", "uniform:1:4", "not a real-valued key"),
    ("lr", "randint:1:4", "not an integer key"),
    ("decoder_depth", "randint:1.5:4", "must be integers"),
    ("decoder_depth", "choice:", "choice needs values"),
    ("decoder_depth", "choice:1,,2", "choice needs values"),
    ("colour", "choice:1,2", "unknown key 'colour'"),
    ("seed", "randint:0:9", "seeds are replicates"),
]


@pytest.mark.parametrize("key,text,kind,values", GOOD_RANGES)
def test_a_range_is_typed_against_its_config_field(key, text, kind, values):
    parsed = parse_range(key, text)
    assert (parsed.kind, parsed.values, parsed.text) == (kind, values, text.strip())
    assert all(type(v) is type(w) for v, w in zip(parsed.values, values))


@pytest.mark.parametrize("key,text,words", BAD_RANGES)
def test_a_bad_range_is_one_line_naming_the_key(key, text, words):
    with pytest.raises(SearchError) as error:
        parse_range(key, text)
    assert str(error.value).startswith(f"{key}=") and words in str(error.value)
    assert "\n" not in str(error.value)


def test_randint_includes_both_ends_as_tune_samples_it():
    domain = parse_range("decoder_depth", "randint:1:3").domain()
    assert {domain.sample() for _ in range(200)} == {1, 2, 3}
    assert parse_range("decoder_depth", "randint:1:3").check_points() == [1, 2, 3]


def test_ranges_are_split_from_other_overrides():
    assert is_range("choice:1,2") and not is_range("folder:/data") and not is_range("0.5,0.75")
    ranges, rest = split_ranges({"lr": "loguniform:1e-4:1e-2", "mask_ratio": "0.5,0.75", "steps": "9"})
    assert ranges == {"lr": "loguniform:1e-4:1e-2"} and rest == {"mask_ratio": "0.5,0.75", "steps": "9"}


def test_the_search_a_run_asks_for():
    assert make_search(algorithm=None, samples=None, metric=None, ranges={}) is None
    spec = make_search(algorithm="random", samples=3, metric=None, ranges={"lr": "loguniform:1e-4:1e-2"})
    assert (spec.algorithm, spec.samples, spec.metric, spec.mode) == ("random", 3, "probe_linear_acc", "max")
    risk = make_search(algorithm="optuna", samples=None, metric="test_mae_risk", ranges={"lr": "uniform:1e-4:1e-3"})
    assert risk.mode == "min" and risk.samples == 4  # the direction from the metric table; the default samples
    block = {"space": {"lr": "loguniform:1e-4:1e-2"}, "algorithm": "optuna", "samples": 5, "metric": "probe_knn_acc"}
    merged = make_search(algorithm="random", samples=None, metric=None, ranges={"decoder_depth": "choice:1,2"},
                         file_search=block)
    assert merged.algorithm == "random" and merged.samples == 5 and merged.metric == "probe_knn_acc"
    assert set(merged.space) == {"lr", "decoder_depth"}  # the command line adds to the file's space


@pytest.mark.parametrize("kwargs,words", [
    (dict(algorithm=None, ranges={"lr": "loguniform:1e-4:1e-2"}), "a range needs --search"),
    (dict(algorithm="random", ranges={}), "give at least one range"),
    (dict(algorithm=None, ranges={}, samples=3), "--samples: only with --search"),
    (dict(algorithm="random", ranges={"lr": "uniform:1e-4:1e-3"}, samples=0), "--samples 0: must be at least 1"),
    (dict(algorithm="random", ranges={"lr": "uniform:1e-4:1e-3"}, metric="accuracy"), "metric 'accuracy'"),
    (dict(algorithm="grid", ranges={"lr": "uniform:1e-4:1e-3"}), "allowed are random, optuna"),
])
def test_a_search_that_cannot_run_is_one_line(kwargs, words):
    kwargs = {"samples": None, "metric": None, **kwargs}
    with pytest.raises(SearchError, match=words):
        make_search(**kwargs)


def _search(ranges: dict[str, str], algorithm: str = "random", samples: int = 2):
    return make_search(algorithm=algorithm, samples=samples, metric=None, ranges=ranges)


def test_range_ends_are_checked_with_every_arm():
    cells = get_study("decoder_width").smoke().cells()
    check_space(_search({"lr": "loguniform:1e-5:1e-1"}), cells)  # every end valid with every arm
    with pytest.raises(SearchError, match=r"mask_ratio=uniform:0.5:0.99.*mask_ratio"):
        check_space(_search({"mask_ratio": "uniform:0.5:0.99"}), cells)  # k = int(M·0.01) = 0
    with pytest.raises(SearchError, match="divisible"):  # an integer between the ends fails
        check_space(_search({"encoder_heads": "randint:2:4"}), cells)


def test_a_searched_axis_leaves_the_grid_and_every_arm_gets_the_samples():
    study = get_study("mask_ratio")
    spec = _search({"mask_ratio": "uniform:0.5:0.9", "lr": "loguniform:1e-4:1e-2"}, samples=3)
    plan = plan_study(study, smoke=True, overrides={"decoder_depth": "1,2"}, search=spec)
    assert list(plan.axes) == ["decoder_depth", "seed"] and plan.num_trials == 2 * 2 * 3
    assert plan.varied == ["decoder_depth", "mask_ratio", "lr", "seed"]
    space, algorithm, samples = tune_space(plan)
    assert type(algorithm).__name__ == "BasicVariantGenerator" and samples == 3
    assert algorithm._constant_grid_search  # sample i is shared by every arm and seed
    assert space["decoder_depth"] == {"grid_search": ["1", "2"]} and "mask_ratio" in space


def test_optuna_gets_one_searcher_per_arm_and_samples_times_arms_times_seeds_trials():
    pytest.importorskip("optuna")
    plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={},
                      search=_search({"lr": "loguniform:1e-4:1e-2"}, "optuna", samples=2))
    space, searcher, samples = tune_space(plan)
    assert space == {} and samples == 2 * 2 * 2  # samples × two ratios × two seeds
    assert len(searcher.searchers) == 2 and searcher.arms == [{"mask_ratio": 0.25}, {"mask_ratio": 0.75}]


def test_arm_search_runs_each_sample_with_every_seed_and_tells_optuna_the_mean(tmp_path):
    pytest.importorskip("optuna")
    from ray import tune

    from studies.arm_search import ArmSearch

    def fresh():
        return ArmSearch([{"decoder_depth": 1}, {"decoder_depth": 4}], [0, 1], {"lr": tune.loguniform(1e-4, 1e-2)},
                         samples=2, metric="probe_linear_acc", mode="max", seed=0)

    search = fresh()
    configs = {f"t{i}": search.suggest(f"t{i}") for i in range(8)}
    assert search.suggest("t8") == search.FINISHED
    assert [(c["decoder_depth"], c["seed"]) for c in configs.values()] == [(1, 0), (1, 1), (4, 0), (4, 1)] * 2
    assert configs["t0"]["lr"] == configs["t1"]["lr"] != configs["t2"]["lr"]  # one sample, both seeds
    assert all(1e-4 <= c["lr"] <= 1e-2 for c in configs.values())
    search.on_trial_complete("t0", {"probe_linear_acc": 0.5})
    assert not search.searchers[0]._ot_study.trials[0].state.is_finished()  # waits for every seed
    search.on_trial_complete("t1", {"probe_linear_acc": 0.7})
    assert search.searchers[0]._ot_study.trials[0].value == pytest.approx(0.6)
    search.on_trial_complete("t2", {"step": 3, "diverged": 1.0})  # no metric: a failed seed
    search.on_trial_complete("t3", None, error=True)
    assert search.searchers[1]._ot_study.trials[0].state.name == "FAIL"

    # Saved mid-search and restored into a new searcher (as Tuner.restore does): it goes on.
    search = fresh()
    first = [search.suggest(f"t{i}") for i in range(3)]
    search.save(str(tmp_path / "state.pkl"))
    restored = fresh()
    restored.restore(str(tmp_path / "state.pkl"))
    assert restored.suggest("t3") == {**first[2], "seed": 1}
    assert [restored.suggest(f"t{i}")["decoder_depth"] for i in range(4, 8)] == [1, 1, 4, 4]
    assert restored.suggest("t8") == restored.FINISHED


def test_resume_refuses_a_changed_search(tmp_path):
    study = get_study("mask_ratio")
    before = plan_study(study, smoke=True, overrides={}, search=_search({"lr": "loguniform:1e-4:1e-2"}))
    from studies.study import cell_id

    save_state(tmp_path, {"cells": sorted(cell_id(c) for c in before.cells), "ray_path": str(tmp_path / "ray"),
                          "search": before.search.describe(), "complete": False})
    options = RunOptions(out_dir=tmp_path, tracking_uri="sqlite:///unused.db", resume=True)
    assert check_resume(before, options)["search"]["samples"] == 2
    for changed in (_search({"lr": "loguniform:1e-4:1e-2"}, samples=3), _search({"lr": "loguniform:1e-5:1e-2"}), None):
        plan = plan_study(study, smoke=True, overrides={}, search=changed)
        with pytest.raises(StudySetupError, match="the search differs"):
            check_resume(plan, options)


@pytest.mark.parametrize("argv,words", [
    (["lr=loguniform:1e-4:1e-2"], "a range needs --search"),
    (["--search", "random"], "give at least one range"),
    (["--search", "random", "lr=loguniform:1e-4:2e-2", "mask_ratio=uniform:0.1:1.5"], "mask_ratio"),
    (["--search", "random", "--metric", "nope", "lr=uniform:1e-4:1e-3"], "metric 'nope'"),
    (["--samples", "3"], "--samples: only with --search"),
])
def test_bad_search_input_exits_2_with_one_line_before_anything_runs(argv, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "mask_ratio", "--smoke", *argv])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mae_runs").exists()


def test_optuna_missing_names_the_extra(tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_optuna(name, *args, **kwargs):
        if name == "optuna" or name.startswith("optuna."):
            raise ImportError("No module named 'optuna'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_optuna)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "mask_ratio", "--smoke", "--search", "optuna", "lr=loguniform:1e-4:1e-2"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in err and "pip install 'mae-study[optuna]'" in err
    assert not (tmp_path / "mae_runs").exists()


def test_the_report_ranks_sampled_configs_within_each_arm():
    rows = []
    for depth, lr, seed, acc, status in [(1, 1e-3, 0, 0.5, "FINISHED"), (1, 1e-3, 1, 0.7, "FINISHED"),
                                         (1, 3e-3, 0, 0.8, "FINISHED"), (1, 3e-3, 1, 0.9, "FINISHED"),
                                         (4, 1e-3, 0, 0.4, "FINISHED"), (4, 1e-3, 1, math.nan, "FAILED"),
                                         (4, 2e-4, 0, math.nan, "FAILED"), (4, 2e-4, 1, math.nan, "FAILED")]:
        rows.append({"decoder_depth": depth, "lr": lr, "seed": seed, "probe_linear_acc": acc, "status": status})
    frame = pd.DataFrame(rows)
    ranking = search_ranking(frame, ["decoder_depth"], ["lr"], "probe_linear_acc", "max")
    assert ranking[["decoder_depth", "lr", "rank", "n", "n_failed"]].values.tolist() == [
        [1, 3e-3, 1, 2, 0], [1, 1e-3, 2, 2, 0], [4, 1e-3, 1, 1, 1], [4, 2e-4, 2, 0, 2]]
    assert ranking["mean"].iloc[0] == pytest.approx(0.85) and ranking["best_in_arm"].tolist() == [True, False, True, False]
    lowest = search_ranking(frame, ["decoder_depth"], ["lr"], "probe_linear_acc", "min")
    assert lowest["lr"].tolist()[:2] == [1e-3, 3e-3]
    assert chosen_zip(ranking, ["decoder_depth"], ["lr"]) == "zip:\n  decoder_depth: [1, 4]\n  lr: [0.003, 0.001]"


def test_a_key_given_a_value_on_the_command_line_leaves_the_files_search(tmp_path):
    import argparse

    from studies.cli.run import _search_of
    from studies.study_files import load_study_file

    path = tmp_path / "tuned.yaml"
    path.write_text("base: {dataset: digits}\naxes: {decoder_depth: [1, 2]}\nseeds: [0]\n"
                    "search: {space: {lr: 'loguniform:1e-4:1e-2', weight_decay: 'uniform:0:0.1'}, samples: 3}\n")
    study = load_study_file(path)

    def search(*overrides, algorithm=None):
        return _search_of(argparse.Namespace(overrides=list(overrides), search=algorithm, samples=None,
                                             metric=None), study)

    assert set(search().space) == {"lr", "weight_decay"} and search().samples == 3
    assert set(search("lr=0.001").space) == {"weight_decay"}
    assert search("lr=0.001", "weight_decay=0.05") is None  # nothing left to sample: the file's grid
    assert set(search("lr=0.001", "mask_ratio=uniform:0.5:0.8").space) == {"weight_decay", "mask_ratio"}
