"""``mae-study train``: one run, no Ray; ``--json`` prints only the final metrics on stdout."""

from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import nullcontext, redirect_stdout
from pathlib import Path

from .common import check_readable_store, default_uri, fail, resolve_config, same_command, ui_command, writable_folder


def cmd_train(args: argparse.Namespace) -> int:
    """One run. With ``--json`` the final metrics are the only thing on stdout: anything else
    printed while it runs goes to stderr, where the progress is."""
    with redirect_stdout(sys.stderr) if args.json else nullcontext():
        status, metrics = _train(args)
    if args.json and metrics is not None:
        print(json.dumps(_json_safe(metrics)))
    return status



def _json_safe(metrics: dict[str, float]) -> dict[str, float | None]:
    """NaN and infinities are not JSON: they become null."""
    return {key: float(value) if math.isfinite(value) else None for key, value in metrics.items()}



def _train(args: argparse.Namespace) -> tuple[int, dict[str, float] | None]:
    """Train and evaluate one config: (exit status, final metrics or None if interrupted)."""
    from mae_core.errors import UserError
    from mae_core.data import prepare_data
    from mae_core.updates import NonFiniteError

    from ..study import SMOKE, smoke_eval

    config = resolve_config(args.config, args.overrides, smoke={**smoke_eval(), **SMOKE} if args.smoke else None)
    data = prepare_data(config)  # data errors and D_norm refusals happen before any run exists
    out = writable_folder(Path(args.out), "--out")
    tracking_uri = args.tracking_uri or default_uri(out)
    check_readable_store(tracking_uri)

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from .. import lifecycle
    from ..interrupts import Interruption
    from ..trial import trial_run_name
    from ..trial_request import TrialRequest, run_request

    console = Console(stderr=True)
    run_name = trial_run_name(config, prefix="smoke-" if args.smoke else "")  # own checkpoint, own run
    checkpoint = lifecycle.checkpoint_for_train(out / "checkpoints" / f"{run_name}.pt", config,
                                      tracking_uri, resume=args.resume)
    console.print(f"[bold]{run_name}[/]  M={config.num_patches} q={config.patch_dim} "
                  f"k={config.num_visible} ρ_eff={config.effective_mask_ratio:.3f}  "
                  f"n_train={len(data.pretraining)} n_test={len(data.test_images)}")  # no float copy
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TextColumn("loss {task.fields[loss]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("train", total=config.steps, loss="-")
        interruption = Interruption()
        try:
            with interruption.installed():
                request = TrialRequest(config, tracking_uri, experiment=args.experiment, run_name=run_name,
                                       checkpoint_path=checkpoint)
                outcome = run_request(
                    request, data, interruption=interruption,
                    on_progress=lambda step, m: progress.update(task, completed=step, loss=f"{m['train_loss']:.4f}"),
                )
        except (NonFiniteError, UserError) as error:  # the run is recorded FAILED with this reason
            fail(str(error), status=1)
        except KeyboardInterrupt as stop:
            progress.stop()
            return _train_interrupted(args, interruption, checkpoint, getattr(stop, "step", None)), None
    _print_metrics(console, outcome.metrics)
    console.print(f"MLflow run {outcome.run_id} in {tracking_uri} (experiment {args.experiment})")
    console.print(f"next: {ui_command(tracking_uri)}", highlight=False, markup=False, soft_wrap=True)
    return 0, outcome.metrics



def _train_interrupted(args: argparse.Namespace, interruption, checkpoint: Path, step: int | None) -> int:
    """Say what an interrupted ``train`` left behind and the command that continues it."""
    from ..interrupts import EXIT_INTERRUPTED

    where = f"after step {step}" if step is not None else "during evaluation or start-up"
    if checkpoint.exists():
        print(f"mae-study: interrupted by {interruption.reason} {where}; the MLflow run is KILLED and "
              f"its checkpoint is kept at {checkpoint}. Continue with:\n  "
              f"{same_command(args, resume=True)}", file=sys.stderr)
    else:
        print(f"mae-study: interrupted by {interruption.reason} before the first checkpoint; nothing to "
              f"resume. Start again with:\n  {same_command(args, resume=False)}", file=sys.stderr)
    return EXIT_INTERRUPTED



def _print_metrics(console, metrics: dict[str, float]) -> None:
    from rich.table import Table

    table = Table("metric", "value", title="held-out split")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.5g}")
    console.print(table)
