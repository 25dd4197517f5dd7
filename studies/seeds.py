"""Seeds by need: ``run --until-decided`` and ``run --add-seeds`` (the runner's batches).

``--until-decided --max-seeds N`` runs the study's seeds, then at each look decides its declared
claims by the sequential plan of :mod:`analysis.sequential` (fixed and named on the parent run
before the first look) and adds a batch of seeds only to the cells an undecided claim reads,
until every claim is decided or those cells hold N seeds. ``--add-seeds 5-9`` adds seeds to
every cell of a study that ran; without a sequential plan the report says that those verdicts
pool seeds added after a look.

A batch is a Ray experiment of its own under the study's parent run (``NAME-lookJ``); it is
recorded in ``study.json`` before Ray starts, so Ctrl-C at any look resumes with ``--resume``.
Every look is logged on the parent run: metrics ``look_alpha_spent``, ``look_max_seeds``,
``look_decided`` and ``look_open`` at step J, and the tag ``sequential_looks`` (the seeds each
cell held at every look), which a report replays.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from mae_core.errors import UserError, clipped

from .runner import RunOptions, StudyPlan, load_state, run_study, save_state
from .study import cell_id, parse_seed_list

LOOKS_TAG = "sequential_looks"
ADDED_TAG = "seeds_added_outside_plan"


class SeedsError(UserError):
    """Bad --until-decided / --add-seeds input (one line, before anything runs)."""


def parse_seeds(text: str) -> list[int]:
    """``5-9`` or ``5,6,7`` (or a mix: ``5-7,12``) -> the seeds, ascending; one line when
    malformed, repeated or past :data:`~studies.study.SEED_LIMIT` (:func:`~studies.study.parse_seed_list`)."""
    try:
        return sorted(parse_seed_list(text, f"--add-seeds {clipped(text)}"))
    except UserError as error:
        raise SeedsError(str(error)) from None


def varied_keys(plan: StudyPlan) -> list[str]:
    return [a for a in plan.axes if a != "seed"] + [k for group in plan.zipped for k in group]


def batch_plan(plan: StudyPlan, rows: list[dict[str, Any]]) -> StudyPlan:
    """A plan that runs exactly ``rows`` (each: every varied key and ``seed``) with the study's
    base keys: one zipped group, so Ray runs those trials and no others."""
    keys = list(rows[0])
    group = {key: [row[key] for row in rows] for key in keys}
    return replace(plan, axes={}, zipped=(group,), cells=[{**plan.base, **row} for row in rows], search=None,
                   batch=True)


def _rows_of(plan: StudyPlan) -> dict[str, dict[str, Any]]:
    """Each grid cell of ``plan`` by its claims spelling (``key=value; ...``), varied keys only."""
    from analysis.claims import cell_text

    keys = varied_keys(plan)
    return {cell_text({k: cell[k] for k in keys}): {k: cell[k] for k in keys} for cell in plan.cells}


def _batch_state(state: dict[str, Any], plan: StudyPlan, rows: list[dict[str, Any]], look: int,
                 options: RunOptions) -> dict[str, Any]:
    name = f"{state['base_name']}-look{look}"
    batch = batch_plan(plan, rows)
    return {**state, "name": name, "ray_path": str(options.out_dir / "ray" / name), "complete": False,
            "cells": sorted(cell_id(c) for c in batch.cells), "batch": rows, "look": look}


def _record_look(client, state: dict[str, Any], look: int, table, sequential, looks: list[dict[str, int]]) -> None:
    """The look on the parent run: the seeds per cell of every look so far (the report replays
    them), and the look's numbers as metrics at step ``look``."""
    from mlflow.entities import Metric

    from analysis.sequential import spent

    from . import tracking

    fullest = max(looks[-1].values(), default=0)
    decided = int(table["verdict"].isin(("better", "worse", "equivalent")).sum()) if len(table) else 0
    now = int(time.time() * 1000)
    values = {"look_alpha_spent": spent(sequential.fraction(fullest), sequential.alpha),
              "look_max_seeds": float(fullest), "look_decided": float(decided),
              "look_open": float(len(table) - decided)}
    client.log_batch(state["parent_run_id"], metrics=[Metric(k, float(v), now, look) for k, v in values.items()])
    verdicts = {row["hypothesis"]: row["verdict"] for row in table.to_dict("records")}
    tracking.set_tags(client, state["parent_run_id"], {
        LOOKS_TAG: json.dumps(looks, separators=(",", ":")),
        **({f"look_{look}": text} if len(text := json.dumps(verdicts, separators=(",", ":"))) < 8000 else {})})


def _look(options: RunOptions, plan: StudyPlan, state: dict[str, Any], sequential, looks: list[dict[str, int]]):
    """Decide the claims on every trial so far, as the plan's looks so far; returns the table."""
    from analysis.claims import resolve_claims
    from analysis.frame import load_runs, load_study_info
    from analysis.sequential import decide_sequential, seeds_per_cell

    info = load_study_info(options.tracking_uri, plan.study.name, options.experiment, state["parent_run_id"])
    frame = load_runs(options.tracking_uri, plan.study.name, options.experiment, state["parent_run_id"])
    axes = [a for a in info["axes"] if a in frame]
    claims, _ = resolve_claims(info.get("claims") or [], info)
    looks.append({cell: len(seeds) for cell, seeds in seeds_per_cell(frame, axes).items()})
    table = decide_sequential(frame, claims, axes, sequential, looks, plan.study.name, robustness=False)
    return table, claims, frame, axes


def run_until_decided(plan: StudyPlan, options: RunOptions, *, max_seeds: int, batch: int | None = None,
                      progress_factory=None, interruption=None) -> dict[str, Any]:
    """Run ``plan``'s seeds, then batches of seeds where claims are undecided (see the module).
    Returns the final state with ``looks`` and ``verdicts`` added."""
    from mlflow.tracking import MlflowClient

    from analysis.sequential import Plan, left_without_seeds, next_seeds, seeds_per_cell

    if not plan.study.claims:
        raise SeedsError(f"--until-decided: study {plan.study.name} declares no claims (add a claims: list to "
                         "its study file)")
    first = len(plan.axes.get("seed", ()))
    if max_seeds < first:
        raise SeedsError(f"--max-seeds {max_seeds}: the study already runs {first} seeds per cell")
    sequential = Plan(max_seeds=max_seeds)
    plan = replace(plan, sequential={**sequential.as_dict(), "batch": batch or first})
    batch = batch or first
    state = load_state(options.out_dir) if options.resume else None
    if state is None or "base_name" not in state:  # the first look's seeds (resumed if interrupted)
        state = run_study(plan, options, progress_factory(plan) if progress_factory else None, interruption)
        state.update(sequential=sequential.as_dict(), base_name=state["name"], look=1, looks=[])
        save_state(options.out_dir, state)
    elif not state.get("complete"):  # an added batch was interrupted: finish it first
        batch_run = batch_plan(_full_plan(plan, state), state["batch"])
        state = run_study(batch_run, replace(options, resume=True),
                          progress_factory(batch_run) if progress_factory else None, interruption)
    client = MlflowClient(options.tracking_uri)
    looks = [dict(look) for look in state.get("looks", [])]  # those recorded before an interruption
    while True:
        full = _full_plan(plan, state)
        table, claims, frame, axes = _look(options, full, state, sequential, looks)
        number = len(looks)
        _record_look(client, state, number, table, sequential, looks)
        state.update(looks=looks)
        save_state(options.out_dir, state)
        added = next_seeds(table, claims, seeds_per_cell(frame, axes), sequential, batch)
        state["no_more_seeds"] = left_without_seeds(table, sequential.max_seeds)
        if not added:
            break
        cells = _rows_of(full)
        rows = [{**cells[cell], "seed": seed} for cell, seeds in added.items() for seed in seeds]
        state = _batch_state(state, full, rows, number + 1, options)
        seeds = sorted({row["seed"] for row in rows})
        state["seeds"] = sorted(set(state.get("seeds", [])) | set(seeds))
        batch_run = batch_plan(full, rows)
        state = run_study(batch_run, replace(options, resume=False),
                          progress_factory(batch_run) if progress_factory else None, interruption, extend=state)
    _summarise(client, options, state, _full_plan(plan, state))
    state.update(verdicts={row["hypothesis"]: row["verdict"] for row in table.to_dict("records")},
                 trials_in_all=len(frame))  # every look's batch, not only the last
    save_state(options.out_dir, state)
    return state


def _full_plan(plan: StudyPlan, state: dict[str, Any]) -> StudyPlan:
    """The study's grid over every seed it holds now (the first batch's and every added one)."""
    seeds = sorted(set(plan.axes.get("seed", ())) | set(state.get("seeds", [])))
    keys = varied_keys(plan)
    rows = {cell_id({k: c[k] for k in keys}): {k: c[k] for k in keys} for c in plan.cells}
    cells = [{**plan.base, **row, "seed": seed} for row in rows.values() for seed in seeds]
    return replace(plan, cells=cells, axes={**plan.axes, "seed": seeds})


def _summarise(client, options: RunOptions, state: dict[str, Any], plan: StudyPlan) -> None:
    """The parent's cell summary over every seed (re-logged after a batch) and its end state."""
    from . import tracking
    from .summary import DONE_TAG, log_study_summary

    parent = client.get_run(state["parent_run_id"])
    if DONE_TAG in parent.data.tags:
        client.delete_tag(state["parent_run_id"], DONE_TAG)
    log_study_summary(client, state["parent_run_id"], parent.info.experiment_id, plan.cells,
                      varied_keys(plan), plan.reference)
    # the grid as it stands now: every seed a look or --add-seeds added, not only the first look's
    tracking.set_tags(client, state["parent_run_id"], {"seeds": json.dumps(plan.axes["seed"]),
                                                       "grid": json.dumps(plan.axes, default=str)})
    client.set_terminated(state["parent_run_id"], "FAILED" if state.get("errored") else "FINISHED")


def add_seeds(plan: StudyPlan, options: RunOptions, seeds: list[int], *, progress_factory=None,
              interruption=None) -> dict[str, Any]:
    """Add ``seeds`` to every cell of the finished study in ``options.out_dir`` (same grid
    otherwise); the report pools them with the others, saying so when no sequential plan
    governs the looks."""
    from mlflow.tracking import MlflowClient

    from . import tracking

    state = load_state(options.out_dir)
    if state is None:
        raise SeedsError(f"--add-seeds: no study in {options.out_dir} to add seeds to (run it first)")
    if options.resume and not state.get("complete") and state.get("batch"):
        rows = state["batch"]
    else:
        if not state.get("complete"):
            raise SeedsError(f"--add-seeds: the study in {options.out_dir} is unfinished; finish it with --resume first")
        have = set(state.get("seeds") or []) | set(plan.axes.get("seed", ()))
        rows = [{**row, "seed": s} for row in _rows_of(plan).values() for s in seeds if s not in have]
        if not rows:
            raise SeedsError(f"--add-seeds {','.join(map(str, seeds))}: every cell already has these seeds")
        state.setdefault("base_name", state["name"])
        state["seeds"] = sorted(set(plan.axes.get("seed", ())) | have | set(seeds))
        state = _batch_state(state, _full_plan(plan, state), rows, int(state.get("look", 1)) + 1, options)
    full = _full_plan(plan, state)
    batch_run = batch_plan(full, rows)
    state = run_study(batch_run, options, progress_factory(batch_run) if progress_factory else None, interruption,
                      extend=None if options.resume else state)
    client = MlflowClient(options.tracking_uri)
    if state.get("sequential") is not None:  # a further look of the study's sequential plan
        from analysis.sequential import Plan

        sequential = Plan.from_dict(state["sequential"])
        looks = [dict(look) for look in state.get("looks", [])]
        table, *_ = _look(options, full, state, sequential, looks)
        _record_look(client, state, len(looks), table, sequential, looks)
        state.update(looks=looks, verdicts={row["hypothesis"]: row["verdict"] for row in table.to_dict("records")})
    else:
        added = sorted(set(state.get("added_outside_plan", [])) | {row["seed"] for row in rows})
        state["added_outside_plan"] = added
        tracking.set_tags(client, state["parent_run_id"], {ADDED_TAG: json.dumps(added)})
    _summarise(client, options, state, full)
    save_state(options.out_dir, state)
    return state
