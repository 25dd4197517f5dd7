"""The ``mae-study`` command line.

Bad input exits with status 2 and one line naming the problem, before Ray starts or an MLflow
run is created; a run that fails while training exits with status 1.

Only light modules are imported here (the typed config imports no torch): torch, Ray and
MLflow are imported inside the commands that use them, so ``--help``, ``--version`` and
``config`` answer at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shlex
import sys
import textwrap
from contextlib import nullcontext, redirect_stdout
from pathlib import Path
from typing import Any, NoReturn

import yaml

from mae_core import files
from mae_core.config import EVAL_PREFIX, Config, ConfigKey, config_keys, parse_overrides, value_text
from mae_core.errors import UserError

from .plugin_option import add_plugin_option, load_command_plugins
from .search import DEFAULT_METRIC, DEFAULT_SAMPLES

BAD_INPUT = 2
DEFAULT_OUT = "mae_runs"  # run's and report's --out: the output folder of studies
DEFAULT_EXPERIMENT = "mae-study"  # (studies.tracking.DEFAULT_EXPERIMENT, without importing MLflow)


class UsageError(UserError):
    """Bad input: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(message)


def _fail(message: str, status: int = BAD_INPUT) -> NoReturn:
    print(f"mae-study: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def load_config_file(path: str | None) -> dict[str, Any]:
    """A YAML mapping of config keys."""
    if path is None:
        return {}
    return files.read_yaml_mapping(Path(path), f"--config {path}", "a mapping of key: value")

def resolve_config(config_file: str | None, overrides: list[str], base: dict[str, Any] | None = None,
                   smoke: dict[str, Any] | None = None) -> Config:
    """``base`` < the config file < ``smoke`` < ``key=value``: as in a study, where the smoke keys
    beat the study's file and the user's overrides beat both."""
    keys = {**(base or {}), **load_config_file(config_file), **(smoke or {}), **parse_overrides(overrides)}
    return Config(**keys)


def writable_folder(path: Path, what: str) -> Path:
    """Create ``path`` if needed and make sure files can be written there."""
    try:
        return files.writable_folder(path)
    except files.FolderNotWritable as error:
        raise UsageError(f"{what} {error}") from None


# ----------------------------------------------------------------------------- commands


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
    from mae_core.train import NonFiniteError, prepare_data

    from .study import SMOKE, SMOKE_EVAL

    config = resolve_config(args.config, args.overrides, smoke={**SMOKE_EVAL, **SMOKE} if args.smoke else None)
    data = prepare_data(config)  # data errors and D_norm refusals happen before any run exists
    out = writable_folder(Path(args.out), "--out")
    tracking_uri = args.tracking_uri or _default_uri(out)

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from . import lifecycle
    from .interrupts import Interruption
    from .trial import run_trial, trial_run_name

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
                outcome = run_trial(
                    config, data, tracking_uri=tracking_uri, experiment=args.experiment, run_name=run_name,
                    checkpoint_path=checkpoint,
                    on_progress=lambda step, m: progress.update(task, completed=step, loss=f"{m['train_loss']:.4f}"),
                    interruption=interruption,
                )
        except NonFiniteError as error:
            _fail(str(error), status=1)
        except KeyboardInterrupt as stop:
            progress.stop()
            return _train_interrupted(args, interruption, checkpoint, getattr(stop, "step", None)), None
    _print_metrics(console, outcome.metrics)
    console.print(f"MLflow run {outcome.run_id} in {tracking_uri} (experiment {args.experiment})")
    console.print(f"next: {ui_command(tracking_uri)}", highlight=False, markup=False, soft_wrap=True)
    return 0, outcome.metrics


def _train_interrupted(args: argparse.Namespace, interruption, checkpoint: Path, step: int | None) -> int:
    """Say what an interrupted ``train`` left behind and the command that continues it."""
    from .interrupts import EXIT_INTERRUPTED

    where = f"after step {step}" if step is not None else "during evaluation or start-up"
    if checkpoint.exists():
        print(f"mae-study: interrupted by {interruption.reason} {where}; the MLflow run is KILLED and "
              f"its checkpoint is kept at {checkpoint}. Continue with:\n  "
              f"{_same_command(args, resume=True)}", file=sys.stderr)
    else:
        print(f"mae-study: interrupted by {interruption.reason} before the first checkpoint; nothing to "
              f"resume. Start again with:\n  {_same_command(args, resume=False)}", file=sys.stderr)
    return EXIT_INTERRUPTED


def _same_command(args: argparse.Namespace, *, resume: bool) -> str:
    """The command the user typed, with ``--resume`` added (or removed)."""
    from .interrupts import command_line

    words = [word for word in args.argv if word != "--resume"]
    return command_line(["mae-study", *words, *(["--resume"] if resume else [])])


def cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .registry import STUDIES
    from .study_files import StudyFileError, load_study_file, local_files

    table = Table("study", "mirrors", "axes (× seeds)", "trials", "smoke")
    table.columns[0].no_wrap = True

    def add(label: str, study) -> None:
        varies = [f"{k}: {', '.join(map(str, v))}" for k, v in study.axes.items()]
        varies += ["zip(" + "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in g.items()) + ")"
                   for g in study.zipped]
        samples = study.search["samples"] if study.search else 1
        if study.search:
            varies.append(f"{study.search['algorithm']} search of {', '.join(study.search['space'])} "
                          f"({samples} samples per arm)")
        table.add_row(label, study.paper, f"{'; '.join(varies)} (× {len(study.seeds)})",
                      str(study.grid_size() * samples), str(study.grid_size(smoke=True) * samples))

    for study in STUDIES.values():
        add(study.name, study)
    for path in local_files(Path.cwd()):  # the user's own study files in this folder
        try:
            add(path.name, load_study_file(path))
        except StudyFileError as error:
            table.add_row(path.name, f"[red]{error}[/]", "", "", "")
    Console().print(table)
    print("run one: mae-study run STUDY [--smoke]; your own grid: mae-study new-study NAME", file=sys.stderr)
    return 0


def cmd_new_study(args: argparse.Namespace) -> int:
    """Write a commented study file to start from."""
    from .study_files import write_template

    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.name):
        raise UsageError(f"study name {args.name!r}: use letters, digits, '_', '-' and '.' only")
    path = write_template(args.name, Path.cwd())
    print(f"wrote {path}; next: mae-study run {path.name} --smoke")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .registry import get_study
    from .runner import RunOptions, default_gpus_per_trial, plan_study, run_study
    from .search import split_ranges

    study = get_study(args.study)
    _check_seed_flags(args)
    search = _search_of(args, study)
    _, fixed = split_ranges(parse_overrides(args.overrides))  # key=value and key=v1,v2; ranges are search's
    plan = plan_study(study, smoke=args.smoke, overrides=fixed, search=search)
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise UsageError(f"--max-concurrent {args.max_concurrent}: must be at least 1")
    _check_workers(args.workers_per_trial, plan.cells, args.gpus_per_trial)
    root = writable_folder(Path(args.out), "--out")
    out = writable_folder(study_folder(root, study.name, args.smoke), "--out")
    options = RunOptions(
        out_dir=out, tracking_uri=args.tracking_uri or _default_uri(root),
        experiment=args.experiment, smoke=args.smoke, resume=args.resume, address=args.address,
        max_concurrent=args.max_concurrent, cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=(args.gpus_per_trial if args.gpus_per_trial is not None
                        # several workers: one whole GPU each where CUDA is (NCCL wants a device per rank)
                        else float(default_gpus_per_trial(plan.num_trials, args.cpus_per_trial, args.address) > 0)
                        if args.workers_per_trial > 1
                        else default_gpus_per_trial(plan.num_trials, args.cpus_per_trial, args.address)),
        scheduler=args.scheduler, command=shlex.join(["mae-study", *args.argv]),
        workers_per_trial=args.workers_per_trial,
    )

    from .interrupts import EXIT_INTERRUPTED, Interruption, sigterm_as_sigint
    from .progress import StudyProgress, progress_metric
    from .runner import StudyInterrupted

    interruption = Interruption()
    try:  # run_study checks the address and the resume state before Ray or MLflow start
        metric, mode = ((search.metric, search.mode) if search is not None else (progress_metric(plan.varied), "min"))
        progress = StudyProgress(total=plan.num_trials, header=_run_header(study, plan), metric=metric, mode=mode)
        with sigterm_as_sigint(interruption):
            state = _run(args, plan, options, progress, interruption, metric, mode, study)
    except StudyInterrupted as stop:
        if stop.state is None:
            print(f"mae-study: interrupted by {stop.reason} before the study was recorded; start it with:"
                  f"\n  {_same_command(args, resume=False)}", file=sys.stderr)
        else:
            print(f"mae-study: study {study.name} interrupted by {stop.reason}; it is recorded as unfinished "
                  f"(MLflow parent run {stop.state['parent_run_id']} KILLED). Continue with:\n  "
                  f"{_same_command(args, resume=True)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"study {study.name}: {state['trials']} trials, {state['errored']} errored, "
          f"{state['diverged']} diverged; MLflow parent run {state['parent_run_id']} in "
          f"{options.tracking_uri}", file=sys.stderr)
    if state.get("looks"):
        verdicts = list((state.get("verdicts") or {}).values())
        counts = ", ".join(f"{verdicts.count(v)} {v}" for v in ("better", "worse", "equivalent", "inconclusive")
                           if v in verdicts)
        print(f"looks: {len(state['looks'])} (seeds per cell at the last: up to "
              f"{max(state['looks'][-1].values(), default=0)}); claims: {counts or 'none decided'}", file=sys.stderr)
    print(f"next: {report_command(args, study.name, state['parent_run_id'])}", file=sys.stderr)
    return 1 if state["errored"] else 0


def _check_workers(workers: int, cells: list[dict], gpus: float | None) -> None:
    """--workers-per-trial N: at least 1, every cell's batch_size (the global batch) splits into N
    equal slices, and with GPUs each worker has a whole one (NCCL refuses two ranks on one
    device); one line otherwise, before Ray starts."""
    if workers > 1 and gpus is not None and 0 < gpus < 1:
        raise UsageError(f"--workers-per-trial {workers} with --gpus-per-trial {gpus:g}: each worker of a "
                         "trial needs a whole GPU (NCCL runs one rank per device)")
    from mae_core.config import Config
    from mae_core.distributed import local_batch_size

    for batch in sorted({Config(**cell).batch_size for cell in cells}):
        try:
            local_batch_size(batch, workers)
        except ValueError as error:
            raise UsageError(f"--workers-per-trial {workers}: {error}") from None


def _check_seed_flags(args: argparse.Namespace) -> None:
    """--until-decided / --add-seeds: one line for a combination that cannot run."""
    if args.until_decided and args.add_seeds:
        raise UsageError("--until-decided and --add-seeds: choose one (--until-decided adds seeds itself)")
    if (args.until_decided or args.add_seeds) and (args.search or args.samples):
        raise UsageError("--until-decided/--add-seeds work on a grid, not with --search")
    if args.until_decided and args.max_seeds < 2:
        raise UsageError(f"--max-seeds {args.max_seeds}: at least 2 seeds per cell")
    if args.seed_batch is not None and args.seed_batch < 1:
        raise UsageError(f"--seed-batch {args.seed_batch}: at least 1")


def _run(args: argparse.Namespace, plan, options, progress, interruption, metric: str, mode: str, study) -> dict:
    """The study's grid, or its seeds by need (studies.seeds)."""
    from .progress import StudyProgress
    from .runner import run_study

    def progress_for(batch_plan):
        return StudyProgress(total=batch_plan.num_trials, header=_run_header(study, batch_plan), metric=metric,
                             mode=mode)

    if args.until_decided:
        from .seeds import run_until_decided

        return run_until_decided(plan, options, max_seeds=args.max_seeds, batch=args.seed_batch,
                                 progress_factory=progress_for, interruption=interruption)
    if args.add_seeds:
        from .seeds import add_seeds, parse_seeds

        return add_seeds(plan, options, parse_seeds(args.add_seeds), progress_factory=progress_for,
                         interruption=interruption)
    return run_study(plan, options, progress=progress, interruption=interruption)


def _search_of(args: argparse.Namespace, study):
    """The search ``run`` asks for (None: a grid): the study file's ``search`` block, then
    ``--search``, ``--samples``, ``--metric`` and the ranges among the ``key=value`` pairs."""
    from .search import make_search, require_optuna, split_ranges

    ranges, fixed = split_ranges(parse_overrides(args.overrides))
    file_search = study.search
    if file_search is not None:  # key=value on the command line beats the file's range of that key
        space = {k: v for k, v in file_search["space"].items() if k not in fixed}
        file_search = {**file_search, "space": space} if space or ranges or args.search else None
    search = make_search(algorithm=args.search, samples=args.samples, metric=args.metric, ranges=ranges,
                         file_search=file_search)
    if search is not None and search.algorithm == "optuna":
        require_optuna()  # the optuna extra: one line before anything starts
    return search


def _run_header(study, plan) -> str:
    """The first progress line: the study, its trial count and what varies."""
    varies = [f"{k}={v}" for k, v in plan.axes.items()]
    varies += ["zip(" + ", ".join(f"{k}={v}" for k, v in group.items()) + ")" for group in plan.zipped]
    if plan.search is not None:
        varies.append(f"{plan.search.algorithm} search of " + ", ".join(
            f"{k}={r.text}" for k, r in plan.search.space.items())
            + f" ({plan.search.samples} samples per arm, {plan.search.mode} {plan.search.metric})")
    return f"study {study.name} ({study.paper}): {plan.num_trials} trials, axes " + ", ".join(varies)


def study_folder(root: Path, study: str, smoke: bool) -> Path:
    """A study's own folder under ``--out``: its ``study.json``, Ray's state (``ray/``) and its
    report (``report/``); smoke runs apart (``STUDY-smoke``), so they never meet a full run's state."""
    return root / (study + ("-smoke" if smoke else ""))


def report_command(args: argparse.Namespace, study: str, parent_run_id: str) -> str:
    """The ``mae-study report`` command for the study ``run`` just ran, with the same ``--out``,
    ``--tracking-uri`` and ``--experiment``, ``--smoke`` for a smoke run, and its parent run id."""
    from .interrupts import command_line

    words = ["mae-study", "report", study]
    if args.out != DEFAULT_OUT:
        words += ["--out", args.out]
    if args.tracking_uri:
        words += ["--tracking-uri", args.tracking_uri]
    if args.experiment != DEFAULT_EXPERIMENT:
        words += ["--experiment", args.experiment]
    if args.smoke:
        words.append("--smoke")
    return command_line([*words, "--run", parent_run_id])


def ui_command(tracking_uri: str) -> str:
    """How to look at the runs: MLflow's UI on this machine for a local store, else the server."""
    from .interrupts import command_line

    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri} in a browser"
    return command_line(["mlflow", "ui", "--backend-store-uri", tracking_uri, "--host", "127.0.0.1"])


def cmd_report(args: argparse.Namespace) -> int:
    """Reads only the MLflow store: any study that logged runs there can be reported. The store
    is the one ``run --out`` wrote (``--out``'s ``mlflow.db``) unless ``--tracking-uri`` names
    another; only full runs are read, or with ``--smoke`` only smoke runs."""
    from analysis.report import write_report

    if args.paper:
        return _report_paper(args)
    if args.study is None:
        raise UsageError("report needs a STUDY (or --paper STUDY[=STORE] ... for MAE Table 1 over several)")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.study):
        raise UsageError(f"study name {args.study!r}: use letters, digits, '_', '-' and '.' only")
    formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
    bad = [f for f in formats if f not in ("png", "pdf", "svg")]
    if bad or not formats:
        raise UsageError(f"--format {args.format}: allowed formats are png, pdf, svg")
    root = Path(args.out)
    tracking_uri = args.tracking_uri or _default_uri(root)
    from . import tracking

    store = tracking.missing_sqlite_store(tracking_uri)
    if store is not None:
        older = Path(tracking.STORE_FILE).resolve()  # where run put the store before --out held it
        hint = (f"; the store in this folder is read with --tracking-uri sqlite:///{older}"
                if older.is_file() and older != store else "")
        raise UsageError(f"no runs of study {args.study}: no MLflow store at {store} (--out is the folder "
                         f"`mae-study run --out` wrote, the report's own folder is --report-dir){hint}")
    old_claims = _old_claims(args.compare) if args.compare else None
    # made by write_report once the run is found: a refused report leaves no folder behind
    out = Path(args.report_dir) if args.report_dir else study_folder(root, args.study, args.smoke) / "report"
    index = write_report(args.study, tracking_uri, out, formats=formats, experiment=args.experiment,
                         parent_run_id=args.run, smoke=args.smoke)
    print(f"report: {index}")
    if old_claims is not None:
        _print_claim_changes(index.parent, old_claims, args.compare)
    print(f"next: {ui_command(tracking_uri)}", file=sys.stderr)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Stored encoders evaluated again with other ``eval.*`` keys (:mod:`studies.reevaluate`):
    every check before a run is created; new runs under a new parent run."""
    if args.study is not None and "=" in args.study:  # ``evaluate --run ID eval.k=v``: a key, not a study
        args.overrides, args.study = [args.study, *args.overrides], None
    if (args.study is None) == (args.run is None):
        raise UsageError("evaluate needs a STUDY or --run RUN_ID (one of them)")
    if args.study is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", args.study):
        raise UsageError(f"study name {args.study!r}: use letters, digits, '_', '-' and '.' only")
    from .reevaluate import eval_overrides

    overrides = eval_overrides(args.overrides)
    root = Path(args.out)
    tracking_uri = args.tracking_uri or _default_uri(root)
    from . import tracking

    store = tracking.missing_sqlite_store(tracking_uri)
    if store is not None:
        raise UsageError(f"nothing to evaluate: no MLflow store at {store} (--out is the folder `mae-study run --out` wrote)")
    import tempfile

    from mlflow.tracking import MlflowClient

    from .interrupts import EXIT_INTERRUPTED, Interruption, sigterm_as_sigint
    from .reevaluate import plan_evaluation, run_evaluation

    client = MlflowClient(tracking_uri)
    interruption = Interruption()
    with tempfile.TemporaryDirectory(prefix="mae-evaluate-") as folder:
        plan = plan_evaluation(client, args.experiment, tracking_uri, Path(folder), study=args.study,
                               run_id=args.run, smoke=args.smoke, overrides=overrides)
        print(f"evaluate: {len(plan.trials)} trial(s) with "
              f"{' '.join(f'{k}={v}' for k, v in overrides.items()) or 'their own eval.* keys'}", file=sys.stderr)

        def done(trial, run_id: str, metrics: dict[str, float]) -> None:
            shown = ", ".join(f"{k} {metrics[k]:.4g}" for k in ("probe_linear_acc", "probe_knn_acc") if k in metrics)
            print(f"  {trial.info.run_name} -> run {run_id}  {shown}", file=sys.stderr)

        baseline_dir = study_folder(root, plan.study, plan.smoke) / "baselines" if plan.study else None
        try:
            with sigterm_as_sigint(interruption):
                parent = run_evaluation(plan, client, tracking_uri=tracking_uri, experiment=args.experiment,
                                        baseline_dir=baseline_dir, command=shlex.join(["mae-study", *args.argv]),
                                        on_trial=done, interrupted_by=lambda: interruption.reason)
        except KeyboardInterrupt:
            print(f"mae-study: evaluate interrupted by {interruption.reason}; its runs are KILLED. Start it "
                  f"again with:\n  {_same_command(args, resume=False)}", file=sys.stderr)
            return EXIT_INTERRUPTED
    print(f"evaluation run {parent} in {tracking_uri} (experiment {args.experiment})", file=sys.stderr)
    if plan.study:
        nxt = report_command(argparse.Namespace(**{**vars(args), "smoke": plan.smoke}), plan.study, parent)
    else:
        nxt = ui_command(tracking_uri)
    print(f"next: {nxt}", file=sys.stderr)
    return 0


def _old_claims(folder: str):
    """The claims.csv of an earlier report (checked before anything is written)."""
    import pandas as pd

    path = Path(folder) / "claims.csv"
    if not path.is_file():
        raise UsageError(f"--compare {folder}: no claims.csv there (a report folder written by mae-study report)")
    return pd.read_csv(path)


def _print_claim_changes(out: Path, old, old_folder: str) -> None:
    import pandas as pd

    from analysis.claims_report import compare_claims

    lines = compare_claims(pd.read_csv(out / "claims.csv"), old)
    print(f"claims changed since {old_folder}: {len(lines) or 'none'}")
    for line in lines:
        print(f"  {line}")


def _report_paper(args: argparse.Namespace) -> int:
    """``report --paper STUDY[=STORE] ...``: one MAE Table 1 (a sub-table per study, in the
    order given) and Figure 5, each study from its own store or from --tracking-uri."""
    from analysis.paper import parse_sources, write_paper

    if args.study is not None:
        raise UsageError(f"report {args.study} --paper: name every study after --paper "
                         f"(mae-study report --paper {args.study} ...)")
    if args.run is not None:
        raise UsageError("--run picks one run of one study; --paper reads each study's newest run")
    formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
    if not formats or any(f not in ("png", "pdf", "svg") for f in formats):
        raise UsageError(f"--format {args.format}: allowed formats are png, pdf, svg")
    sources = parse_sources(args.paper, args.tracking_uri or _default_uri(Path(args.out)))
    from .tracking import missing_sqlite_store

    for source in sources:
        store = missing_sqlite_store(source.tracking_uri)
        if store is not None:
            raise UsageError(f"no runs of study {source.study}: no MLflow store at {store} "
                             f"(give it as {source.study}=STORE, or pass --tracking-uri)")
    out = writable_folder(Path(args.report_dir) if args.report_dir else Path(args.out) / "paper", "--report-dir")
    paths = write_paper(sources, out, formats=formats, experiment=args.experiment, smoke=args.smoke)
    print("paper: " + ", ".join(str(p) for p in paths))
    print(f"next: cd {shlex.quote(str(out))} && pdflatex paper_preview.tex")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Every key (or the ones named): default, allowed range and meaning, as a table or as a
    YAML file of defaults that ``mae-study train --config`` reads unchanged."""
    keys = _chosen_keys(args.keys)
    if args.yaml:
        sys.stdout.write(defaults_yaml(keys))
        print("next: save this as config.yaml, edit it, then: mae-study train --config config.yaml",
              file=sys.stderr)
        return 0
    _print_config_table(keys)
    print("next: mae-study train key=value ...  (or mae-study config --yaml > config.yaml)", file=sys.stderr)
    return 0


def _chosen_keys(names: list[str]) -> list[ConfigKey]:
    """The catalogue entries of ``names`` in the order given (all of them when none is given)."""
    import difflib

    catalogue = {key.name: key for key in config_keys()}
    for name in names:
        if name not in catalogue:
            close = difflib.get_close_matches(name, catalogue, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UsageError(f"config: unknown key {name!r}{hint}; `mae-study config` lists every key")
    return [catalogue[name] for name in names] if names else list(catalogue.values())


def _print_config_table(keys: list[ConfigKey]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("key", "default", "allowed", "unit and meaning",
                  caption="Also checked together: k = int(M·(1-mask_ratio)) in [1, M-1]; "
                          "widths divisible by heads; patch_size divides the image.")
    table.columns[0].no_wrap = True
    table.columns[0].min_width = max(len(key.name) for key in keys)
    for key in keys:
        table.add_row(key.name, value_text(key.default), key.allowed, key.description)
    console = Console()
    if not console.is_terminal:  # piped or in a file: no terminal width to respect, so read more per line
        console.width = 120
    console.print(table)


def defaults_yaml(keys: list[ConfigKey] | None = None) -> str:
    """A YAML file of ``keys`` (default: every key) at their defaults, each under a comment with
    its meaning and allowed values; the ``eval.*`` keys nest under ``eval:``."""
    keys = config_keys() if keys is None else keys
    top = [key for key in keys if not key.name.startswith(f"{EVAL_PREFIX}.")]
    nested = [key for key in keys if key.name.startswith(f"{EVAL_PREFIX}.")]
    lines = ["# mae-study config: the defaults (`mae-study config` explains each key).",
             "# Use: mae-study train --config THIS_FILE [key=value ...]", ""]
    lines += [line for key in top for line in _yaml_entry(key.name, key)]
    if nested:
        lines.append(f"{EVAL_PREFIX}:  # {Config.model_fields[EVAL_PREFIX].description}")
        lines += ["  " + line for key in nested
                  for line in _yaml_entry(key.name.removeprefix(f"{EVAL_PREFIX}."), key)]
    return "\n".join(lines) + "\n"


def _yaml_entry(name: str, key: ConfigKey) -> list[str]:
    """``# meaning [allowed]`` then ``name: default`` (yaml writes the value, so it reads back exactly)."""
    if isinstance(key.default, (tuple, list)):  # one flow-style line (``[0.01, 0.1]``) in the eval: block
        value = f"{name}: {yaml.safe_dump(list(key.default), default_flow_style=True).strip()}"
    else:
        value = yaml.safe_dump({name: key.default}, allow_unicode=True).strip()
    return [f"# {key.description} [{key.allowed}]", value]


def cmd_bench(args: argparse.Namespace) -> int:
    """Runs ``python -m benchmarks.bench`` from the source checkout: the benchmarks sit above the
    studies (they drive them), so the CLI starts them rather than importing them."""
    import subprocess

    if not Path("benchmarks", "bench.py").is_file():  # ``python -m`` finds it in the working directory
        raise UsageError("bench: the benchmarks live in the source checkout (benchmarks/); "
                         "run `mae-study bench` from its root")
    if args.device == "cuda":  # the GPU measurements: benchmarks/bench_cuda.py
        flags = ["--device", "cuda", *(["--out", args.out] if args.out else [])]
        return subprocess.call([sys.executable, "-m", "benchmarks.bench_cuda", *flags])
    flags = [*(["--quick"] if args.quick else []), *(["--json"] if args.json else []),
             *(["--out", args.out] if args.out else [])]
    return subprocess.call([sys.executable, "-m", "benchmarks.bench", *flags])


def _default_uri(folder: Path) -> str:
    from .tracking import default_tracking_uri

    return default_tracking_uri(folder)


def _print_metrics(console, metrics: dict[str, float]) -> None:
    from rich.table import Table

    table = Table("metric", "value", title="held-out split")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.5g}")
    console.print(table)


# ------------------------------------------------------------------------------- parser


def package_version() -> str:
    """The installed ``mae-study`` distribution's version; in a checkout that was never installed,
    the version pyproject.toml declares."""
    from importlib import metadata

    try:
        return metadata.version("mae-study")
    except metadata.PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def _config_keys_epilog() -> str:
    """``train --help``'s list of key names (the table with defaults is ``mae-study config``)."""
    names = ", ".join(key.name for key in config_keys())
    return ("config keys (key=value; defaults, units and ranges: mae-study config [KEY ...]):\n"
            + textwrap.fill(names, width=88, initial_indent="  ", subsequent_indent="  ",
                            break_on_hyphens=False))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mae-study", description="Ablation studies of masked autoencoders.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    # not required here: main() answers a bare ``mae-study`` with the usage itself
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)

    train = commands.add_parser("train", help="one run, no Ray", epilog=_config_keys_epilog(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--config", help="YAML file of config keys (mae-study config --yaml writes one)")
    train.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite file in --out)")
    train.add_argument("--experiment", default="mae-study", help="MLflow experiment name")
    train.add_argument("--out", default=".",
                       help="folder for the MLflow store (mlflow.db, mlartifacts/) and checkpoints/ (default: .)")
    train.add_argument("--resume", action="store_true",
                       help="continue the interrupted run from its checkpoint in --out/checkpoints")
    train.add_argument("--smoke", action="store_true",
                       help="tiny data and steps (the studies' smoke keys; key=value still wins): seconds")
    train.add_argument("--json", action="store_true",
                       help="print the final metrics as one JSON object on stdout (the rest goes to stderr)")
    train.add_argument("overrides", nargs="*", metavar="key=value")
    add_plugin_option(train)
    train.set_defaults(handler=cmd_train)

    run = commands.add_parser("run", help="a study's grid with Ray Tune")
    run.add_argument("study", help="a built-in study (mae-study list) or a study file (my_study.yaml)")
    run.add_argument("--smoke", action="store_true", help="tiny data and steps: seconds")
    run.add_argument("--resume", action="store_true", help="continue the interrupted study")
    run.add_argument("--address", help="join a Ray cluster: auto | host:port | ray://host:port")
    run.add_argument("--max-concurrent", type=int, help="at most this many trials at once")
    run.add_argument("--scheduler", choices=("fifo", "asha"), default="fifo",
                     help="asha stops poor trials early: for exploratory sweeps, not ablation tables")
    run.add_argument("--cpus-per-trial", type=float, default=1.0,
                     help="CPU cores per trial (torch uses as many threads)")
    run.add_argument("--gpus-per-trial", type=float,
                     help="a GPU's share per trial, e.g. 0.125 packs 8 trials on one GPU (default: "
                          "0 without CUDA; with CUDA, one GPU shared by the trials that fit the CPUs, at most 8)")
    run.add_argument("--workers-per-trial", type=int, default=1,
                     help="train each trial on N Ray Train workers (DDP: gloo on CPUs, NCCL on GPUs), each with "
                          "--cpus-per-trial/--gpus-per-trial; batch_size stays the global batch, split evenly")
    run.add_argument("--out", default=DEFAULT_OUT,
                     help="the output folder: the MLflow store (mlflow.db, mlartifacts/) unless --tracking-uri, "
                          "and STUDY[-smoke]/ with study.json, Ray's state and the report (default: mae_runs)")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite:///<abs --out>/mlflow.db)")
    run.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment name")
    run.add_argument("--search", choices=("random", "optuna"),
                     help="sample keys from ranges (key=loguniform:LOW:HIGH, uniform:LOW:HIGH, "
                          "randint:LOW:HIGH, choice:A,B,...) for every arm of the grid; each sample runs "
                          "once per seed. random: Tune's random search, the same samples for every arm; "
                          "optuna: an Optuna TPE study per arm (pip install 'mae-study[optuna]')")
    run.add_argument("--samples", type=int, help=f"sampled configs per arm of the grid (default {DEFAULT_SAMPLES})")
    run.add_argument("--metric", help=f"what --search optimises and ranks by (default {DEFAULT_METRIC}; "
                                      "its direction comes from the metric table)")
    run.add_argument("--until-decided", action="store_true",
                     help="after the study's seeds, add seeds only where a declared claim is undecided, by a "
                          "sequential plan fixed before the first look, until every claim is decided or --max-seeds")
    run.add_argument("--max-seeds", type=int, default=20, help="--until-decided: at most this many seeds per cell "
                                                               "(default 20)")
    run.add_argument("--seed-batch", type=int, help="--until-decided: seeds added per look (default: the study's count)")
    run.add_argument("--add-seeds", metavar="SEEDS",
                     help="add seeds (5-9 or 5,6,7) to every cell of the finished study in --out; the report pools them")
    run.add_argument("overrides", nargs="*", metavar="key=value",
                     help="config keys; key=v1,v2 makes an axis; key=KIND:ARGS a range for --search; seeds=0,1,2")
    add_plugin_option(run)
    run.set_defaults(handler=cmd_run)

    bench = commands.add_parser("bench", help="speed measurements against a peer, as ratios")
    bench.add_argument("--quick", action="store_true", help="fewer rounds and images")
    bench.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    bench.add_argument("--out", help="results folder (default: benchmarks/results under the working directory)")
    bench.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="cuda: the GPU measurements (ViT-B/16 against transformers, digits run, exact risk)")
    bench.set_defaults(handler=cmd_bench)

    new_study = commands.add_parser("new-study", help="write a commented study file NAME.yaml")
    new_study.add_argument("name")
    new_study.set_defaults(handler=cmd_new_study)

    config = commands.add_parser("config", help="every config key: default, allowed range, meaning")
    config.add_argument("keys", nargs="*", metavar="KEY", help="only these keys (e.g. mask_ratio eval.fewshot)")
    config.add_argument("--yaml", action="store_true",
                        help="print a YAML file of the defaults that train --config accepts")
    config.set_defaults(handler=cmd_config)

    listing = commands.add_parser("list", help="the built-in studies and the study files here")
    listing.set_defaults(handler=cmd_list)

    report = commands.add_parser("report", help="tables and figures of a study from MLflow")
    report.add_argument("study", nargs="?")
    report.add_argument("--compare", metavar="OLD_REPORT_DIR",
                        help="after writing the report, print every claim whose verdict changed since the "
                             "report in OLD_REPORT_DIR (its claims.csv), with both n, effects and intervals")
    report.add_argument("--paper", nargs="+", metavar="STUDY[=STORE]",
                        help="MAE Table 1 with a sub-table per study (in this order) and Figure 5; "
                             "STORE: a tracking URI, an mlflow.db or its folder (default: --out's mlflow.db), "
                             "or the trials.csv of a report")
    report.add_argument("--out", default=DEFAULT_OUT,
                        help="the study's output folder, as given to run: its mlflow.db is read (default: mae_runs)")
    report.add_argument("--report-dir", help="where the report goes (default: OUT/STUDY/report, "
                                             "OUT/STUDY-smoke/report with --smoke, OUT/paper with --paper)")
    report.add_argument("--smoke", action="store_true",
                        help="report a smoke run (without it only full runs are read; a smoke report says so)")
    report.add_argument("--format", default="png,pdf", help="figure formats: png,pdf,svg")
    report.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite:///<abs --out>/mlflow.db)")
    report.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    report.add_argument("--run", metavar="PARENT_RUN_ID",
                        help="report this run of the study (default: its newest full run, or smoke run with --smoke)")
    add_plugin_option(report)
    report.set_defaults(handler=cmd_report)

    evaluate = commands.add_parser("evaluate", help="stored encoders evaluated again with other eval.* keys, no training")
    evaluate.add_argument("study", nargs="?", help="every finished trial of the study's newest run (or --run ID)")
    evaluate.add_argument("--run", metavar="RUN_ID", help="one run (a trial, or a train run) instead of a study")
    evaluate.add_argument("--out", default=DEFAULT_OUT,
                          help="the folder run wrote: its mlflow.db is read and written (default: mae_runs)")
    evaluate.add_argument("--smoke", action="store_true", help="the study's newest smoke run (without it: full runs)")
    evaluate.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite:///<abs --out>/mlflow.db)")
    evaluate.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    evaluate.add_argument("overrides", nargs="*", metavar="eval.key=value",
                          help="evaluation keys only (eval.knn_ks=5,20: a comma is part of the value)")
    add_plugin_option(evaluate)
    evaluate.set_defaults(handler=cmd_evaluate)
    return parser


def _no_command(parser: argparse.ArgumentParser) -> NoReturn:
    """A bare ``mae-study``: the usage, then the one-line error (exit status 2)."""
    parser.print_help(sys.stderr)
    raise UsageError("no command given; try: mae-study train --smoke")


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; a bare ``mae-study`` (or options without a command) gets the usage."""
    # key=value may follow options (``run mask_ratio --smoke steps=50``), which a plain
    # nargs="*" positional does not accept: collect the stragglers here (``config`` KEYs too).
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        _no_command(parser)
    rest = "overrides" if hasattr(args, "overrides") else "keys" if hasattr(args, "keys") else None
    unknown = [item for item in extra if item.startswith("-") or rest is None]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        setattr(args, rest, [*getattr(args, rest), *extra])
    return args


def quiet_libraries() -> None:
    """No library chatter on the console, unless the user set these variables: Ray's usage
    statistics and its token-authentication notice, MLflow's schema creation lines. Set before
    Ray or MLflow start, so Ray's workers inherit them."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local Ray of our own: no token, no notice
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a report's downloads
    # MLflow sets its own level on import; the variable keeps schema-creation chatter away
    # from this process and from Ray's workers, which inherit it.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.getLogger("mlflow").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()
    try:
        parser = build_parser()
        args = _parse(parser, argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        load_command_plugins(args)
        return args.handler(args)
    except UserError as error:  # every error a user can cause and fix: one line, exit 2
        _fail(str(error))
    except KeyboardInterrupt:  # before any run was created: nothing to record or resume
        print("mae-study: interrupted before anything was recorded", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
