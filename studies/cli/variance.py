"""``mae-study variance STUDY [--cell key=value ...] [--levels K]``: each source of randomness
varied alone at one cell, through Ray Tune and MLflow; its variance component per metric
(:mod:`analysis.variance`) in ``OUT/STUDY[-smoke]/variance/``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from mae_core.config import parse_overrides
from mae_core.grid import find_cell, typed_value

from .common import UsageError, check_readable_store, default_uri, removed_if_refused, study_folder, writable_folder


def cmd_variance(args: argparse.Namespace) -> int:
    from analysis.variance import DEFAULT_LEVELS, VARIANCE_DIR, variance_design

    from ..planning import plan_study
    from ..named_studies import get_study

    levels = DEFAULT_LEVELS if args.levels is None else args.levels
    if levels < 2:
        raise UsageError(f"--levels {levels}: at least 2 levels per source (a variance needs two values)")
    study = get_study(args.study)
    cell = chosen_cell(study.smoke() if args.smoke else study, args.cell or [])
    design = variance_design(study, cell, levels)
    plan = plan_study(design, smoke=args.smoke, overrides={})  # every trial validated, its data loadable
    root = Path(args.out)
    with removed_if_refused(root, study_folder(root, design.name, args.smoke)):
        root = writable_folder(root, "--out")
        tracking_uri = args.tracking_uri or default_uri(root)
        check_readable_store(tracking_uri)
        out = writable_folder(study_folder(root, design.name, args.smoke), "--out")
        state = _run(args, plan, out, tracking_uri)
    if state is None:
        return 130
    from analysis.variance import advice_text, repeats_advice, write_variance

    table, seconds = _components(tracking_uri, design, args.experiment, state["parent_run_id"])
    advice = repeats_advice(table, *seconds)
    folder = study_folder(root, study.name, args.smoke) / VARIANCE_DIR
    paths = write_variance(table, folder, advice=advice)
    for line in advice_text(advice):
        print(f"  {line}", file=sys.stderr)
    decided = table.dropna(subset=["variance"])
    print(f"variance of {study.name} at {cell or 'its only cell'}: {len(decided)} components "
          f"({decided['metric'].nunique()} metrics x {decided['source'].nunique()} sources), "
          f"{state['errored']} errored trials; {', '.join(str(p) for p in paths)}", file=sys.stderr)
    report = ["mae-study", "report", study.name, *(["--out", args.out] if args.out != "mae_runs" else []),
              *(["--tracking-uri", args.tracking_uri] if args.tracking_uri else []),
              *(["--smoke"] if args.smoke else [])]
    print(f"next: {shlex.join(report)}", file=sys.stderr)
    return 1 if state["errored"] else 0


def chosen_cell(study, pairs: list[str]) -> dict[str, Any]:
    """The cell of ``study``'s grid that ``--cell key=value`` pairs name (a key left out keeps
    the reference cell's value); the reference cell without pairs. One line for a key that is no
    axis of the study or a cell outside its grid."""
    reference = study.reference_cell()
    given = {key: typed_value(key, value) for key, value in parse_overrides(pairs).items()}
    unknown = [key for key in given if key not in reference]
    if unknown:
        axes = ", ".join(sorted(reference)) or "none (the study has one cell)"
        raise UsageError(f"--cell {unknown[0]}=...: not an axis of study {study.name}; its axes: {axes}")
    cell = {**reference, **given}
    if cell and find_cell(cell, study.grid_axes(), study.grid_zipped()) is None:
        grid = {**study.grid_axes(), **{k: v for group in study.grid_zipped() for k, v in group.items()}}
        raise UsageError(f"--cell {' '.join(pairs)}: {cell} is not a cell of study {study.name}'s grid {grid}")
    return cell


def _run(args: argparse.Namespace, plan, out: Path, tracking_uri: str) -> dict | None:
    """The design through the runner (Ray Tune, MLflow); its state, or None when interrupted."""
    from ..interrupts import Interruption, sigterm_as_sigint
    from ..planning import RunOptions
    from ..preflight import default_gpus_per_trial
    from ..progress import StudyProgress
    from ..runner import StudyInterrupted, run_study

    options = RunOptions(out_dir=out, tracking_uri=tracking_uri, experiment=args.experiment,
                         resume=args.resume, max_concurrent=args.max_concurrent,
                         gpus_per_trial=default_gpus_per_trial(plan.num_trials, 1.0, None),
                         command=shlex.join(["mae-study", *args.argv]))
    progress = StudyProgress(total=plan.num_trials, header=f"variance design {plan.study.name}: "
                                                           f"{plan.num_trials} trials", metric="test_mae_risk",
                             mode="min")
    interruption = Interruption()
    try:
        with sigterm_as_sigint(interruption):
            return run_study(plan, options, progress=progress, interruption=interruption)
    except StudyInterrupted as stop:
        print(f"mae-study: variance design interrupted by {stop.reason}; continue with:\n  "
              f"{shlex.join(['mae-study', *[w for w in args.argv if w != '--resume'], '--resume'])}",
              file=sys.stderr)
        return None


def _components(tracking_uri: str, design, experiment: str, parent_run_id: str):
    from analysis.trials_frame import load_runs
    from analysis.variance import components, trial_seconds

    frame = load_runs(tracking_uri, design.name, experiment, parent_run_id)
    return components(frame, int(design.seeds[0])), trial_seconds(frame)
