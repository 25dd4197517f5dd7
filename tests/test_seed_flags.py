"""Seeds by need refuse what they cannot do (``run --until-decided``, ``--add-seeds``,
``--max-seeds``, ``--seed-batch``): one line naming the input, exit status 2, before Ray or an
MLflow run, and nothing new in ``--out``; and the look loop ends even when planning goes wrong.
Everything here runs in this process without Ray (the Ray-started cases are in
tests/scenarios/test_seeds_by_need.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import SEEDS_BY_NEED_STUDY as STUDY, own_ray
from studies.cli import main

SEARCHED = STUDY + 'search: {space: {lr: "loguniform:1e-4:1e-2"}, samples: 2, algorithm: random}\n'


def tree(folder: Path) -> list[str]:
    """Every path under ``folder`` (empty when it does not exist)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.fixture
def study_file(tmp_path, monkeypatch) -> Path:
    own_ray()  # the suite's shared Ray, if an earlier test started it: these tests check none starts
    monkeypatch.chdir(tmp_path)
    (tmp_path / "seeds_by_need.yaml").write_text(STUDY)
    (tmp_path / "searched.yaml").write_text(SEARCHED.replace("name: seeds_by_need", "name: searched"))
    return tmp_path / "seeds_by_need.yaml"


def refused(tmp_path: Path, capsys, *args: str) -> str:
    """Run ``mae-study run ARGS --smoke --out out``; check the refusal's shape and that ``out``
    holds what it held before; the one line."""
    import ray

    before = tree(tmp_path / "out")
    try:
        status = main(["run", *args, "--smoke", "--out", "out"])
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert tree(tmp_path / "out") == before, "a refusal leaves nothing new in --out"
    assert not ray.is_initialized(), "Ray never started"
    return lines[0]


def finished_study(tmp_path: Path, *, settings: bool = True) -> Path:
    """study.json of the smoke study as a finished run leaves it (no Ray, no MLflow); with
    ``settings`` False as one written before study.json kept its cells' settings."""
    from studies.planning import cell_settings
    from studies.named_studies import get_study
    from studies.runner import plan_study, save_state
    from studies.study import cell_id

    plan = plan_study(get_study("seeds_by_need.yaml"), smoke=True, overrides={})
    state = {"study": "seeds_by_need", "parent_run_id": "0" * 32, "name": "seeds_by_need-smoke-1",
             "ray_path": str(tmp_path / "out" / "ray"), "cells": sorted(cell_id(c) for c in plan.cells),
             "axes": plan.axes, "complete": True, "search": None, "trials": 4, "errored": 0, "diverged": 0,
             **({"settings": cell_settings(plan.cells)} if settings else {})}
    folder = tmp_path / "out" / "seeds_by_need-smoke"
    save_state(folder, state)
    return folder


# ------------------------------------------------------------------- item: an endless run


def test_until_decided_refuses_a_study_file_with_a_search_block(study_file, tmp_path, capsys):
    line = refused(tmp_path, capsys, "searched.yaml", "--until-decided")
    assert "--until-decided" in line and "searched" in line and "search: block" in line
    line = refused(tmp_path, capsys, "searched.yaml", "--add-seeds", "2")
    assert "--add-seeds" in line and "search: block" in line


def test_until_decided_refuses_a_maximum_that_leaves_no_seeds_to_add(study_file, tmp_path, capsys):
    line = refused(tmp_path, capsys, "seeds_by_need.yaml", "--until-decided", "--max-seeds", "2")
    assert line.startswith("mae-study: error: --max-seeds 2: the study already runs 2 seeds per cell")


# --------------------------------------------------------------- item: no silent pooling


@pytest.mark.parametrize("settings", [True, False], ids=["study.json", "study.json before settings"])
@pytest.mark.parametrize("overrides", [["lr=0.05", "decoder_depth=1"], ["mask_ratio=0.5,0.75,0.9"],
                                       ["mask_ratio=0.5"]])
def test_add_seeds_refuses_overrides_that_change_the_trials_settings(study_file, tmp_path, capsys,
                                                                   overrides, settings):
    finished_study(tmp_path, settings=settings)
    line = refused(tmp_path, capsys, "seeds_by_need.yaml", "--add-seeds", "1-2", *overrides)
    assert "--add-seeds 1,2: the trials' settings differ from those of the study in" in line, line


def test_the_settings_check_passes_the_studys_own_keys_and_seeds(study_file, tmp_path):
    from studies.named_studies import get_study
    from studies.runner import load_state, plan_study
    from studies.seeds_by_need import check_same_settings

    for settings in (True, False):
        state = load_state(finished_study(tmp_path, settings=settings))
        for overrides in ({}, {"seeds": "0,1,2"}, {"mask_ratio": "0.5,0.75"}):
            plan = plan_study(get_study("seeds_by_need.yaml"), smoke=True, overrides=overrides)
            check_same_settings(plan, state, "--add-seeds 2", tmp_path)  # no error


def test_add_seeds_with_resume_on_a_finished_study_says_it_is_finished(study_file, tmp_path, capsys):
    finished_study(tmp_path)
    line = refused(tmp_path, capsys, "seeds_by_need.yaml", "--add-seeds", "2", "--resume")
    assert "is finished" in line and "drop --resume" in line and "interrupted" not in line, line


def test_until_decided_refuses_overrides_that_take_a_claims_cell_away(study_file, tmp_path, capsys):
    line = refused(tmp_path, capsys, "seeds_by_need.yaml", "--until-decided", "mask_ratio=0.75,0.9")
    assert "claim half_masked_linear" in line and "mask_ratio=0.5" in line, line
    line = refused(tmp_path, capsys, "seeds_by_need.yaml", "--until-decided", "mask_ratio=0.5")
    assert "claim half_masked_linear does not fit" in line, line


def test_until_decided_keeps_claims_that_overrides_leave_in_place(study_file):
    from studies.named_studies import get_study
    from studies.runner import plan_study
    from studies.seeds_by_need import check_claims_fit

    for overrides in ({"lr": 0.01}, {"mask_ratio": "0.5,0.75,0.9"}, {"decoder_depth": "1,2"}):
        check_claims_fit(plan_study(get_study("seeds_by_need.yaml"), smoke=True, overrides=overrides))


# ------------------------------------------------------------- item: late or silent input


@pytest.mark.parametrize("flag", [["--max-seeds", "5"], ["--seed-batch", "2"]])
def test_a_seed_flag_without_until_decided_is_refused(study_file, tmp_path, capsys, flag):
    line = refused(tmp_path, capsys, "seeds_by_need.yaml", *flag)
    assert f"{' '.join(flag)}: only with --until-decided" in line, line


def test_a_refusal_leaves_no_study_folder_in_out(study_file, tmp_path, capsys):
    line = refused(tmp_path, capsys, "seeds_by_need.yaml", "--resume")  # found once the folders were made
    assert "no study to resume" in line
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    refused(tmp_path, capsys, "seeds_by_need.yaml", "--add-seeds", "2")  # no study to add seeds to
    assert tree(tmp_path / "out") == []


@pytest.mark.parametrize("folder", ["mlartifacts", "mlartifacts/mae-study", "seeds_by_need-smoke/ray"])
def test_an_output_folder_that_cannot_take_files_is_refused_before_training(study_file, tmp_path, capsys, folder):
    (tmp_path / "out" / folder).parent.mkdir(parents=True)
    (tmp_path / "out" / folder).write_text("not a folder")  # root ignores a read-only mode; not this
    line = refused(tmp_path, capsys, "seeds_by_need.yaml")
    assert line.startswith("mae-study: error: --out ") and f"{folder}: cannot be written" in line, line


# ---------------------------------------------------- the look loop ends when a look adds none


@pytest.mark.parametrize("batches", ["add no trial", "fail every trial"])
def test_the_look_loop_ends_when_a_batch_adds_no_finished_trial(study_file, tmp_path, monkeypatch, batches):
    """Planning gone wrong: every look asks for more seeds (next_seeds patched), but the batches
    add no trial, or only failed ones; the loop must end after the first such batch."""
    import analysis.trials_frame
    import analysis.sequential
    import mlflow.tracking

    from studies import seeds_by_need
    from studies.named_studies import get_study
    from studies.runner import RunOptions, plan_study

    rng = np.random.default_rng(0)
    rows: list[dict] = []

    def trials(seed_rows: list[dict], status: str) -> None:
        rows.extend({"status": status, "seed": r["seed"], "mask_ratio": r["mask_ratio"],
                     "probe_linear_acc": 0.8 + rng.normal(0, 0.02), "run_id": f"r{len(rows)}"} for r in seed_rows)

    calls = []

    def fake_run_study(plan, options, progress=None, interruption=None, extend=None):
        calls.append(plan.batch)
        assert len(calls) <= 3, "the look loop did not end"
        if plan.batch and batches == "fail every trial":
            trials([{"seed": c["seed"], "mask_ratio": c["mask_ratio"]} for c in plan.cells], "FAILED")
        elif not plan.batch:
            trials(plan.cells, "FINISHED")
        return {**(extend or {"name": "seeds_by_need-smoke-1", "parent_run_id": "p"}), "complete": True,
                "trials": len(plan.cells), "errored": 0, "diverged": 0}

    info = {"axes": ["mask_ratio"], "grid": {"mask_ratio": [0.5, 0.75], "seed": [0, 1]},
            "reference": {"mask_ratio": 0.75}, "zip": [], "claims": list(get_study("seeds_by_need.yaml").claims)}
    monkeypatch.setattr(seeds_by_need, "run_study", fake_run_study)
    monkeypatch.setattr(seeds_by_need, "_record_look", lambda *args: None)
    monkeypatch.setattr(seeds_by_need, "_summarise", lambda *args: None)
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda *args: None)
    monkeypatch.setattr(analysis.trials_frame, "load_study_info", lambda *args: info)
    monkeypatch.setattr(analysis.trials_frame, "load_runs", lambda *args: pd.DataFrame(rows))
    monkeypatch.setattr(analysis.sequential, "next_seeds",
                        lambda table, claims, held, plan, batch: {"mask_ratio=0.5": [2, 3], "mask_ratio=0.75": [2, 3]})

    plan = plan_study(get_study("seeds_by_need.yaml"), smoke=True, overrides={})
    options = RunOptions(out_dir=tmp_path / "out", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    state = seeds_by_need.run_until_decided(plan, options, max_seeds=10)
    assert calls == [False, True]  # the first look's seeds, one batch, and no batch after it
    assert state["looks"] == [{"mask_ratio=0.5": 2, "mask_ratio=0.75": 2}]
    assert "would hold no trial" in state["stalled"]
