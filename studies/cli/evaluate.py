"""``mae-study evaluate``: stored encoders evaluated again with other ``eval.*`` settings."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..study import check_study_name
from .common import (UsageError, check_readable_store, default_uri, report_command, same_command, study_folder,
                     ui_command)


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Stored encoders evaluated again with other ``eval.*`` keys (:mod:`studies.reevaluate`):
    every check before a run is created; new runs under a new parent run."""
    if args.study is not None and "=" in args.study:  # ``evaluate --run ID eval.k=v``: a key, not a study
        args.overrides, args.study = [args.study, *args.overrides], None
    if (args.study is None) == (args.run is None):
        raise UsageError("evaluate needs a STUDY or --run RUN_ID (one of them)")
    if args.study is not None:
        check_study_name(args.study, "study")
    from ..reevaluate import eval_overrides

    overrides = eval_overrides(args.overrides)
    root = Path(args.out)
    tracking_uri = args.tracking_uri or default_uri(root)
    from .. import tracking

    store = tracking.missing_sqlite_store(tracking_uri)
    if store is not None:
        raise UsageError(f"nothing to evaluate: no MLflow store at {store} (--out is the folder `mae-study run --out` wrote)")
    check_readable_store(tracking_uri)
    import tempfile

    from mlflow.tracking import MlflowClient

    from ..interrupts import EXIT_INTERRUPTED, Interruption, sigterm_as_sigint
    from ..reevaluate import plan_evaluation, run_evaluation

    client = MlflowClient(tracking_uri)
    interruption = Interruption()
    with tempfile.TemporaryDirectory(prefix="mae-evaluate-") as folder:
        plan = plan_evaluation(client, args.experiment, tracking_uri, Path(folder), study=args.study,
                               run_id=args.run, smoke=args.smoke, overrides=overrides)
        print(f"evaluate: {len(plan.trials)} trial(s) with "
              f"{' '.join(f'{k}={v}' for k, v in overrides.items()) or 'their own eval.* keys'}", file=sys.stderr)

        from evaluation.metrics import all_rows

        # the accuracies of MAE Table 1's columns (fine-tune, linear, few-shot, kNN, a plugin's): the
        # metric table's rows that name a column, whichever evaluators logged them
        headline = [row.name for row in sorted(all_rows(), key=lambda row: row.column_rank) if row.column]

        def done(trial, run_id: str, metrics: dict[str, float]) -> None:
            shown = ", ".join(f"{k} {metrics[k]:.4g}" for k in headline if k in metrics)
            print(f"  {trial.info.run_name} -> run {run_id}  {shown}", file=sys.stderr)

        baseline_dir = study_folder(root, plan.study, plan.smoke) / "baselines" if plan.study else None
        try:
            with sigterm_as_sigint(interruption):
                parent = run_evaluation(plan, client, tracking_uri=tracking_uri, experiment=args.experiment,
                                        baseline_dir=baseline_dir, command=shlex.join(["mae-study", *args.argv]),
                                        on_trial=done, interrupted_by=lambda: interruption.reason)
        except KeyboardInterrupt:
            print(f"mae-study: evaluate interrupted by {interruption.reason}; its runs are KILLED. Start it "
                  f"again with:\n  {same_command(args, resume=False)}", file=sys.stderr)
            return EXIT_INTERRUPTED
    print(f"evaluation run {parent} in {tracking_uri} (experiment {args.experiment})", file=sys.stderr)
    if plan.study:
        nxt = report_command(argparse.Namespace(**{**vars(args), "smoke": plan.smoke}), plan.study, parent)
    else:
        nxt = ui_command(tracking_uri)
    print(f"next: {nxt}", file=sys.stderr)
    return 0
