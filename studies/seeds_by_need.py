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

import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from analysis.study_header import added_tags, grid_tags, look_tags
from mae_core.errors import UserError, clipped

from . import testing_hooks, tracking
from .planning import cell_settings
from .runner import RunOptions, StudyPlan, load_state, run_study, save_state
from .study import cell_id, parse_seed_list



class SeedsError(UserError):
    """Bad --until-decided / --add-seeds input (one line, before anything runs)."""


def parse_seeds(text: str) -> list[int]:
    """``5-9`` or ``5,6,7`` (or a mix: ``5-7,12``) -> the seeds, ascending; one line when
    malformed, repeated or past :data:`~studies.study.SEED_LIMIT` (:func:`~studies.study.parse_seed_list`)."""
    try:
        return sorted(parse_seed_list(text, f"--add-seeds {clipped(text)}"))
    except UserError as error:
        raise SeedsError(str(error)) from None


def check_until_decided(plan: StudyPlan, max_seeds: int) -> None:
    """What ``--until-decided`` needs before anything runs: claims to decide, room to add seeds
    (``max_seeds`` above the study's own count) and claims that still read their cells under the
    command line's overrides (:func:`check_claims_fit`); one line otherwise."""
    if not plan.study.claims:
        raise SeedsError(f"--until-decided: study {plan.study.name} declares no claims (add a claims: list to "
                         "its study file)")
    first = len(plan.axes.get("seed", ()))
    if max_seeds <= first:
        raise SeedsError(f"--max-seeds {max_seeds}: the study already runs {first} seeds per cell; give more for "
                         "--until-decided to have seeds to add")
    check_claims_fit(plan)


def check_claims_fit(plan: StudyPlan) -> None:
    """Every declared claim that fits the study's own grid (smoke or not) still reads each cell
    it reads there once the command line's overrides shape the grid: a claim whose cell, axis
    or reference an override took away is refused by name, not dropped or moved to other cells
    (the sequential plan is fixed for the claims as declared). Cells an override adds are fine."""
    from analysis.claims import cell_text, check_claims, claim_cells

    study = plan.study
    axes = {k: v for k, v in plan.axes.items() if k != "seed"}
    for raw in study.claims:
        name = raw.get("name", "?") if isinstance(raw, dict) else "?"
        try:
            [declared] = check_claims([raw], study.grid_axes(), study.grid_zipped(), study.reference_cell())
        except ValueError:
            continue  # not a claim of this grid even without overrides (a smoke grid): the report says so
        try:
            [overridden] = check_claims([raw], axes, plan.zipped, plan.reference)
        except ValueError as error:
            raise SeedsError(f"--until-decided: claim {name} does not fit the grid these overrides make "
                             f"({str(error).split(': ', 1)[-1]}); drop the overrides of its keys") from None
        keys = list(declared["reference"])
        now = {cell_text({k: c[k] for k in keys}) for c in claim_cells(overridden)}
        lost = [text for c in claim_cells(declared) if (text := cell_text({k: c[k] for k in keys})) not in now]
        if lost:
            raise SeedsError(f"--until-decided: claim {name} reads cell {lost[0]}, which these overrides take "
                             "away from the grid; drop the overrides of its keys")


def check_same_settings(plan: StudyPlan, state: dict[str, Any], flag: str, out_dir) -> None:
    """Seeds added to a study that ran must train its trials' settings: the command line's
    overrides may not change a cell (seeds aside), or the report would pool different
    experiments as one. The same check ``--resume`` makes of the grid (one line, before Ray)."""
    if "settings" in state and cell_settings(plan.cells) != state["settings"] \
            or "settings" not in state and not _recorded_cells_match(plan, state):
        raise SeedsError(f"{flag}: the trials' settings differ from those of the study in {out_dir} (the same "
                         "study, key=value overrides and --smoke are required); give the study's own keys, or "
                         "--out FOLDER for a new study")


def _recorded_cells_match(plan: StudyPlan, state: dict[str, Any]) -> bool:
    """Whether ``plan`` makes the trials ``state`` last ran (``cells``: the first look's grid, or
    the last batch's rows); for a study.json written before it kept ``settings``. The command
    line's values are typed as the study file's are (``mask_ratio=0.5`` is ``0.5``)."""
    from mae_core.grid import typed_value

    typed = replace(plan, base={k: typed_value(k, v) for k, v in plan.base.items()},
                    cells=[{k: typed_value(k, v) for k, v in c.items()} for c in plan.cells])
    return _makes_recorded_cells(plan, state) or _makes_recorded_cells(typed, state)


def _makes_recorded_cells(plan: StudyPlan, state: dict[str, Any]) -> bool:
    rows = _rows_of(plan)
    if state.get("batch"):
        from analysis.claims import cell_text

        keys = varied_keys(plan)
        if any(set(row) - {"seed"} != set(keys) or cell_text({k: row[k] for k in keys}) not in rows
               for row in state["batch"]):
            return False
        cells = [{**plan.base, **row} for row in state["batch"]]
    else:
        seeds = (state.get("axes") or {}).get("seed", plan.axes.get("seed", ()))
        cells = [{**plan.base, **row, "seed": seed} for row in rows.values() for seed in seeds]
    return sorted(cell_id(cell) for cell in cells) == sorted(state.get("cells", []))


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

    fullest = max(looks[-1].values(), default=0)
    decided = int(table["verdict"].isin(("better", "worse", "equivalent")).sum()) if len(table) else 0
    now = int(time.time() * 1000)
    values = {"look_alpha_spent": spent(sequential.fraction(fullest), sequential.alpha),
              "look_max_seeds": float(fullest), "look_decided": float(decided),
              "look_open": float(len(table) - decided)}
    client.log_batch(state["parent_run_id"], metrics=[Metric(k, float(v), now, look) for k, v in values.items()])
    verdicts = {row["hypothesis"]: row["verdict"] for row in table.to_dict("records")}
    tracking.set_tags(client, state["parent_run_id"], look_tags(looks, verdicts))


def _look(options: RunOptions, plan: StudyPlan, state: dict[str, Any], sequential, looks: list[dict[str, int]]):
    """Decide the claims on every trial so far, as the plan's looks so far; returns the table.
    A look that finds the seeds of the last recorded one (a look resumed after an interruption,
    or a batch that added no finished trial) is that look again, not a new one."""
    from analysis.claims import resolve_claims
    from analysis.trials_frame import load_runs, load_study_info
    from analysis.sequential import decide_sequential, seeds_per_cell

    info = load_study_info(options.tracking_uri, plan.study.name, options.experiment, state["parent_run_id"])
    frame = load_runs(options.tracking_uri, plan.study.name, options.experiment, state["parent_run_id"])
    axes = [a for a in info["axes"] if a in frame]
    claims, _ = resolve_claims(info.get("claims") or [], info)
    held = {cell: len(seeds) for cell, seeds in seeds_per_cell(frame, axes).items()}
    if not looks or looks[-1] != held:
        looks.append(held)
    table = decide_sequential(frame, claims, axes, sequential, looks, plan.study.name, robustness=False)
    return table, claims, frame, axes


def new_rows(plan: StudyPlan, added: dict[str, list[int]], frame, axes: list[str]) -> list[dict[str, Any]]:
    """The trials a look asks for (``added``: seeds by cell, :func:`analysis.sequential.next_seeds`)
    that the study has not run yet, in any state: a seed whose trial failed or diverged is not
    run again (it would fail again, and its cell would ask for it at every look)."""
    from analysis.sequential import seeds_per_cell

    ran = seeds_per_cell(frame.drop(columns="status", errors="ignore"), axes)  # every state, not only FINISHED
    cells = _rows_of(plan)
    return [{**cells[cell], "seed": seed} for cell, seeds in added.items() for seed in seeds
            if seed not in ran.get(cell, ())]




def run_until_decided(plan: StudyPlan, options: RunOptions, *, max_seeds: int, batch: int | None = None,
                      progress_factory=None, interruption=None) -> dict[str, Any]:
    """Run ``plan``'s seeds, then batches of seeds where claims are undecided (see the module).
    Returns the final state with ``looks`` and ``verdicts`` added.

    The looks end when every claim is decided or has its seeds, and also when a look would add
    no trial or a batch added none (planning gone wrong must not loop for ever). SIGINT/SIGTERM
    between looks ends the parent run KILLED and the study unfinished, as during a batch."""
    from mlflow.tracking import MlflowClient

    from analysis.sequential import SequentialPlan, left_without_seeds, next_seeds, seeds_per_cell

    from .runner import STOP_REQUESTED

    check_until_decided(plan, max_seeds)
    STOP_REQUESTED.clear()  # a signal of an earlier study in this process is not this one's
    first = len(plan.axes.get("seed", ()))
    sequential = SequentialPlan(max_seeds=max_seeds)
    plan = replace(plan, sequential={**sequential.as_dict(), "batch": batch or first})
    batch = batch or first
    state = load_state(options.out_dir) if options.resume else None
    if state is not None and "base_name" in state:
        check_same_settings(plan, state, "--until-decided --resume", options.out_dir)
    if state is None or "base_name" not in state:  # the first look's seeds (resumed if interrupted)
        state = run_study(plan, options, progress_factory(plan) if progress_factory else None, interruption)
        state.update(sequential=sequential.as_dict(), base_name=state["name"], look=1, looks=[])
        save_state(options.out_dir, state)
    elif not state.get("complete") and not state.get(BETWEEN_LOOKS):  # an added batch was interrupted
        batch_run = batch_plan(_full_plan(plan, state), state["batch"])
        state = run_study(batch_run, replace(options, resume=True),
                          progress_factory(batch_run) if progress_factory else None, interruption)
    client = MlflowClient(options.tracking_uri)
    looks = [dict(look) for look in state.get("looks", [])]  # those recorded before an interruption
    with _between_looks(client, options, state, interruption):
        if state.pop(BETWEEN_LOOKS, None):  # its trials all ran: the looks go on under the same run
            _reopen(client, options, state)
        batch_ran = False
        while True:
            _stop_if_asked(interruption)
            recorded = len(looks)
            full = _full_plan(plan, state)
            table, claims, frame, axes = _look(options, full, state, sequential, looks)
            if batch_ran and len(looks) == recorded:  # the batch added no finished trial
                state["stalled"] = f"look {recorded + 1} would hold no trial that look {recorded} did not"
                break
            if len(looks) > recorded:  # (a look resumed after an interruption is on the parent run already)
                _record_look(client, state, len(looks), table, sequential, looks)
            state.update(looks=looks)
            save_state(options.out_dir, state)
            testing_hooks.hold_between_looks(interruption.requested if interruption is not None else None)
            _stop_if_asked(interruption)
            added = next_seeds(table, claims, seeds_per_cell(frame, axes), sequential, batch)
            state["no_more_seeds"] = left_without_seeds(table, sequential.max_seeds)
            rows = new_rows(full, added, frame, axes)
            if not rows:
                break
            state = _batch_state(state, full, rows, len(looks) + 1, options)
            state["seeds"] = sorted(set(state.get("seeds", [])) | {row["seed"] for row in rows})
            batch_run = batch_plan(full, rows)
            state = run_study(batch_run, replace(options, resume=False),
                              progress_factory(batch_run) if progress_factory else None, interruption, extend=state)
            batch_ran = True
        _summarise(client, options, state, _full_plan(plan, state))
        state.update(verdicts={row["hypothesis"]: row["verdict"] for row in table.to_dict("records")},
                     trials_in_all=len(frame))  # every look's batch, not only the last
        save_state(options.out_dir, state)
    return state


BETWEEN_LOOKS = "interrupted_between_looks"  # in study.json: every trial had run; only looks were left


@contextmanager
def _between_looks(client, options: RunOptions, state: dict[str, Any], interruption):
    """SIGINT/SIGTERM while the driver looks, plans or summarises (no Ray Tune loop to stop
    gracefully): the parent run ends KILLED with the signal, the study is saved unfinished as
    its last saved state (``--resume`` goes on from there), and :class:`StudyInterrupted` is
    raised. A signal a handler Ray left behind swallowed is caught at the next look."""
    from .runner import StudyInterrupted

    try:
        yield
        if interruption is not None and interruption.requested():
            raise KeyboardInterrupt(interruption.reason)
    except KeyboardInterrupt:
        reason = interruption.reason if interruption is not None else "SIGINT"
        saved = load_state(options.out_dir) or state
        if saved.get("complete"):
            saved[BETWEEN_LOOKS] = True
        saved.update(complete=False, interrupted=reason)
        tracking.mark_killed(client, saved["parent_run_id"], reason)
        save_state(options.out_dir, saved)
        raise StudyInterrupted(saved, reason) from None


def _reopen(client, options: RunOptions, state: dict[str, Any]) -> None:
    """The parent run RUNNING again for the looks left after an interruption between looks."""
    tracking.reopen(client, state["parent_run_id"])
    tracking.record_continuing_commit(client, state["parent_run_id"])
    state.pop("interrupted", None)
    state["complete"] = True  # every trial ran (a further interruption marks it unfinished again)
    save_state(options.out_dir, state)


def _stop_if_asked(interruption) -> None:
    """A signal noted but not raised (Ray Tune's handler, left behind by a batch, only notes it)."""
    from .runner import STOP_REQUESTED

    if (interruption is not None and interruption.requested()) or STOP_REQUESTED.is_set():
        raise KeyboardInterrupt(interruption.reason if interruption is not None else "SIGINT")


def _full_plan(plan: StudyPlan, state: dict[str, Any]) -> StudyPlan:
    """The study's grid over every seed it holds now (the first batch's and every added one)."""
    seeds = sorted(set(plan.axes.get("seed", ())) | set(state.get("seeds", [])))
    keys = varied_keys(plan)
    rows = {cell_id({k: c[k] for k in keys}): {k: c[k] for k in keys} for c in plan.cells}
    cells = [{**plan.base, **row, "seed": seed} for row in rows.values() for seed in seeds]
    return replace(plan, cells=cells, axes={**plan.axes, "seed": seeds})


def _summarise(client, options: RunOptions, state: dict[str, Any], plan: StudyPlan) -> None:
    """The parent's cell summary over every seed (re-logged after a batch) and its end state."""
    from .summary import DONE_TAG, log_study_summary

    parent = client.get_run(state["parent_run_id"])
    if DONE_TAG in parent.data.tags:
        client.delete_tag(state["parent_run_id"], DONE_TAG)
    log_study_summary(client, state["parent_run_id"], parent.info.experiment_id, plan.cells,
                      varied_keys(plan), plan.reference)
    # the grid as it stands now: every seed a look or --add-seeds added, not only the first look's
    tracking.set_tags(client, state["parent_run_id"], grid_tags(plan.axes))
    client.set_terminated(state["parent_run_id"], "FAILED" if state.get("errored") else "FINISHED")


def add_seeds(plan: StudyPlan, options: RunOptions, seeds: list[int], *, progress_factory=None,
              interruption=None) -> dict[str, Any]:
    """Add ``seeds`` to every cell of the finished study in ``options.out_dir`` (same grid
    otherwise: overrides that change a trial's settings are refused); the report pools them
    with the others, saying so when no sequential plan governs the looks."""
    from mlflow.tracking import MlflowClient

    flag = f"--add-seeds {','.join(map(str, seeds))}"
    state = load_state(options.out_dir)
    if state is None:
        raise SeedsError(f"{flag}: no study in {options.out_dir} to add seeds to (run it first)")
    if options.resume:
        rows = _batch_to_resume(plan, state, flag, options.out_dir)
    else:
        if not (state.get("complete") or state.get(BETWEEN_LOOKS)):  # not every trial of it ran
            raise SeedsError(f"{flag}: the study in {options.out_dir} is unfinished; finish it first (the "
                             "command that started it, with --resume)")
        check_same_settings(plan, state, flag, options.out_dir)
        have = set(state.get("seeds") or []) | set(plan.axes.get("seed", ()))
        rows = [{**row, "seed": s} for row in _rows_of(plan).values() for s in seeds if s not in have]
        if not rows:
            raise SeedsError(f"{flag}: every cell already has these seeds")
        state.pop(BETWEEN_LOOKS, None)
        state.setdefault("base_name", state["name"])
        state["seeds"] = sorted(set(plan.axes.get("seed", ())) | have | set(seeds))
        state = _batch_state(state, _full_plan(plan, state), rows, int(state.get("look", 1)) + 1, options)
    full = _full_plan(plan, state)
    batch_run = batch_plan(full, rows)
    if state.pop(BETWEEN_LOOKS, None):  # the batch ran; the look after it was interrupted
        _reopen(MlflowClient(options.tracking_uri), options, state)
    else:
        state = run_study(batch_run, options, progress_factory(batch_run) if progress_factory else None,
                          interruption, extend=None if options.resume else state)
    client = MlflowClient(options.tracking_uri)
    with _between_looks(client, options, state, interruption):
        if state.get("sequential") is not None:  # a further look of the study's sequential plan
            from analysis.sequential import SequentialPlan

            sequential = SequentialPlan.from_dict(state["sequential"])
            looks = [dict(look) for look in state.get("looks", [])]
            recorded = len(looks)
            table, *_ = _look(options, full, state, sequential, looks)
            if len(looks) > recorded:  # (not when the batch added no finished trial)
                _record_look(client, state, len(looks), table, sequential, looks)
            state.update(looks=looks,
                         verdicts={row["hypothesis"]: row["verdict"] for row in table.to_dict("records")})
        else:
            added = sorted(set(state.get("added_outside_plan", [])) | {row["seed"] for row in rows})
            state["added_outside_plan"] = added
            tracking.set_tags(client, state["parent_run_id"], added_tags(added))
        _summarise(client, options, state, full)
        save_state(options.out_dir, state)
    return state


def _batch_to_resume(plan: StudyPlan, state: dict[str, Any], flag: str, out_dir) -> list[dict[str, Any]]:
    """``--add-seeds --resume``: the rows of the added batch an interruption left, or one line
    saying what the study in ``out_dir`` holds instead."""
    if state.get("complete"):
        raise SeedsError(f"{flag} --resume: the study in {out_dir} is finished, with no added seeds left "
                         "unfinished; drop --resume to add these seeds")
    if not state.get("batch"):
        raise SeedsError(f"{flag} --resume: the study in {out_dir} was interrupted before any seeds were added "
                         "to it; finish it with the command that started it, with --resume")
    check_same_settings(plan, state, f"{flag} --resume", out_dir)
    return state["batch"]
