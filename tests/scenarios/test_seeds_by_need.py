"""Seeds by need through real Ray Tune and MLflow: ``--add-seeds`` pools new seeds with the old
in one report, and ``--until-decided`` adds seeds only where a declared claim is open, each look
recorded on the parent run."""

from __future__ import annotations

import json

import pandas as pd
from mlflow.tracking import MlflowClient

from conftest import SEEDS_BY_NEED_STUDY as STUDY, Command, run_cli



def _cli(tmp_path, *args: str) -> Command:
    done = run_cli(list(args), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _children(store: str, study: str) -> list:
    client = MlflowClient(store)
    parents = client.search_runs([client.get_experiment_by_name("mae-study").experiment_id],
                                 f"tags.study = '{study}'", max_results=1000)
    return [r for r in parents if "mlflow.parentRunId" in r.data.tags], \
        [r for r in parents if "mlflow.parentRunId" not in r.data.tags]


def test_add_seeds_pools_the_new_seeds_with_the_old_in_one_report(tmp_path):
    (tmp_path / "seeds_by_need.yaml").write_text(STUDY)
    _cli(tmp_path, "run", "seeds_by_need.yaml", "--smoke", "--out", "out")
    for wrong in (["lr=0.05", "decoder_depth=1"], ["--resume"]):  # other settings; nothing to resume
        refused = run_cli(["run", "seeds_by_need.yaml", "--smoke", "--out", "out", "--add-seeds", "2", *wrong],
                          tmp_path)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "--add-seeds 2" in refused.stderr and "interrupted" not in refused.stderr
    _cli(tmp_path, "run", "seeds_by_need.yaml", "--smoke", "--out", "out", "--add-seeds", "2")
    store = f"sqlite:///{tmp_path}/out/mlflow.db"
    children, parents = _children(store, "seeds_by_need")
    assert len(parents) == 1 and len(children) == 6  # one study: 2 cells x seeds 0, 1 and 2
    assert {r.info.status for r in children} == {"FINISHED"}
    assert json.loads(parents[0].data.tags["seeds_added_outside_plan"]) == [2]
    assert json.loads(parents[0].data.tags["grid"])["seed"] == [0, 1, 2]  # the grid as it stands now
    _cli(tmp_path, "report", "seeds_by_need", "--smoke", "--out", "out", "--report-dir", "report", "--format", "png")
    claims = pd.read_csv(tmp_path / "report" / "claims.csv")
    assert list(claims["n"]) == [3] and "outside a sequential plan" in claims["pooled"].iloc[0]
    trials = pd.read_csv(tmp_path / "report" / "trials.csv")
    assert sorted(trials["seed"]) == [0, 0, 1, 1, 2, 2]


def test_until_decided_adds_seeds_only_where_a_claim_is_open_and_records_every_look(tmp_path):
    (tmp_path / "seeds_by_need.yaml").write_text(STUDY)
    done = _cli(tmp_path, "run", "seeds_by_need.yaml", "--smoke", "--out", "out", "--until-decided",
                "--max-seeds", "3", "--seed-batch", "1")
    store = f"sqlite:///{tmp_path}/out/mlflow.db"
    children, parents = _children(store, "seeds_by_need")
    parent = parents[0]
    plan = json.loads(parent.data.tags["sequential_plan"])
    assert plan["max_seeds"] == 3 and plan["spending"].startswith("pocock-type (Lan & DeMets 1983)")
    looks = json.loads(parent.data.tags["sequential_looks"])
    history = MlflowClient(store).get_metric_history(parent.info.run_id, "look_max_seeds")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == [max(look.values()) for look in looks]
    first = json.loads(parent.data.tags["look_1"])
    # open at the first look and within the plan's seeds: one more seed for both cells
    left = "open claims left at the seeds they have, since --max-seeds 3" in done.stderr
    if set(first.values()) == {"inconclusive"} and not left:
        assert len(looks) == 2 and looks[1] == {"mask_ratio=0.5": 3, "mask_ratio=0.75": 3} and len(children) == 6
    else:  # decided at once, or needing more seeds than the plan allows: nothing added
        assert len(looks) == 1 and len(children) == 4
    assert "looks: " in done.stderr and f"study seeds_by_need: {len(children)} trials in all" in done.stderr
    _cli(tmp_path, "report", "seeds_by_need", "--smoke", "--out", "out", "--report-dir", "report", "--format", "png")
    claims = pd.read_csv(tmp_path / "report" / "claims.csv")
    assert list(claims["look"]) == [len(looks)] or claims["verdict"].iloc[0] != "inconclusive"
