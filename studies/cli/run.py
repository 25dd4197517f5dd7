"""``mae-study run``: a study's grid (or its search, or its seeds by need) through Ray Tune."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from mae_core.config import Config, parse_overrides

from .common import (UsageError, check_readable_store, default_uri, removed_if_refused, report_command,
                     same_command, study_folder, writable_folder)

DEFAULT_MAX_SEEDS = 20  # --until-decided without --max-seeds


def cmd_run(args: argparse.Namespace) -> int:
    from ..named_studies import get_study
    from ..runner import plan_study
    from ..search import split_ranges

    study = get_study(args.study)
    _check_seed_flags(args)
    search = _search_of(args, study)
    if (args.until_decided or args.add_seeds) and search is not None:  # a search block in the study file
        raise UsageError(f"{'--until-decided' if args.until_decided else '--add-seeds'}: study {study.name} "
                         "searches (its file's search: block); seeds by need run a grid (fix every searched key "
                         "with key=value, or drop the flag)")
    _, fixed = split_ranges(parse_overrides(args.overrides))  # key=value and key=v1,v2; ranges are search's
    plan = plan_study(study, smoke=args.smoke, overrides=fixed, search=search)
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise UsageError(f"--max-concurrent {args.max_concurrent}: must be at least 1")
    gpus_per_trial = gpus_of_trials_per_gpu(args.trials_per_gpu, args.gpus_per_trial)
    _check_workers(args.workers_per_trial, plan.cells, gpus_per_trial)
    if args.until_decided:
        from ..seeds_by_need import check_until_decided

        check_until_decided(plan, _max_seeds(args))
    root = Path(args.out)
    with removed_if_refused(root, study_folder(root, study.name, args.smoke)):  # a refusal leaves no folder
        return _run_checked(args, study, plan, search, gpus_per_trial)


def _run_checked(args: argparse.Namespace, study, plan, search, gpus_per_trial: float | None) -> int:
    """The study in its folder under ``--out``, once its input was checked."""
    from ..runner import RunOptions, default_gpus_per_trial

    root = writable_folder(Path(args.out), "--out")
    tracking_uri = args.tracking_uri or default_uri(root)
    check_readable_store(tracking_uri)  # one line, before the study's folder exists
    out = writable_folder(study_folder(root, study.name, args.smoke), "--out")
    _check_output_folders(out, tracking_uri, args.experiment, "--tracking-uri" if args.tracking_uri else "--out")
    options = RunOptions(
        out_dir=out, tracking_uri=tracking_uri,
        experiment=args.experiment, resume=args.resume, address=args.address,
        max_concurrent=args.max_concurrent, cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=(gpus_per_trial if gpus_per_trial is not None
                        # several workers: one whole GPU each where CUDA is (NCCL wants a device per rank)
                        else float(default_gpus_per_trial(plan.num_trials, args.cpus_per_trial, args.address) > 0)
                        if args.workers_per_trial > 1
                        else default_gpus_per_trial(plan.num_trials, args.cpus_per_trial, args.address)),
        scheduler=args.scheduler, command=shlex.join(["mae-study", *args.argv]),
        workers_per_trial=args.workers_per_trial, trials_per_gpu=args.trials_per_gpu,
    )

    from ..interrupts import EXIT_INTERRUPTED, Interruption, sigterm_as_sigint
    from ..progress import StudyProgress, progress_metric
    from ..runner import StudyInterrupted

    interruption = Interruption()
    try:  # run_study checks the address and the resume state before Ray or MLflow start
        metric, mode = ((search.metric, search.mode) if search is not None else (progress_metric(plan.varied), "min"))
        progress = StudyProgress(total=plan.num_trials, header=_run_header(study, plan), metric=metric, mode=mode)
        with sigterm_as_sigint(interruption):
            state = _run(args, plan, options, progress, interruption, metric, mode, study)
    except StudyInterrupted as stop:
        if stop.state is None:
            print(f"mae-study: interrupted by {stop.reason} before the study was recorded; start it with:"
                  f"\n  {same_command(args, resume=False)}", file=sys.stderr)
        else:
            print(f"mae-study: study {study.name} interrupted by {stop.reason}; it is recorded as unfinished "
                  f"(MLflow parent run {stop.state['parent_run_id']} KILLED). Continue with:\n  "
                  f"{same_command(args, resume=True)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    batch = f" in all; the last look's batch: {state['trials']}," if "trials_in_all" in state else ","
    print(f"study {study.name}: {state.get('trials_in_all', state['trials'])} trials{batch} {state['errored']} "
          f"errored, {state['diverged']} diverged; MLflow parent run {state['parent_run_id']} in "
          f"{options.tracking_uri}", file=sys.stderr)
    if state.get("looks"):
        verdicts = list((state.get("verdicts") or {}).values())
        counts = ", ".join(f"{verdicts.count(v)} {v}" for v in ("better", "worse", "equivalent", "inconclusive")
                           if v in verdicts)
        print(f"looks: {len(state['looks'])} (seeds per cell at the last: up to "
              f"{max(state['looks'][-1].values(), default=0)}); claims: {counts or 'none decided'}", file=sys.stderr)
        if state.get("stalled"):
            print(f"looks stopped: {state['stalled']} (its trials failed or were not run)", file=sys.stderr)
        if state.get("no_more_seeds"):
            from analysis.claims import FUTILITY_POWER, seeds_text

            needs = "; ".join(f"{h} (needs {seeds_text(n)} at its observed effect)"
                              for h, n in state["no_more_seeds"].items())
            print(f"open claims left at the seeds they have, since --max-seeds {state['sequential']['max_seeds']} "
                  f"would decide them with a chance below {FUTILITY_POWER:.0%} were their true difference "
                  f"delta (conditional power): {needs}", file=sys.stderr)
    print(f"next: {report_command(args, study.name, state['parent_run_id'])}", file=sys.stderr)
    return 1 if state["errored"] else 0



def gpus_of_trials_per_gpu(trials_per_gpu: int | None, gpus_per_trial: float | None) -> float | None:
    """The GPU share a trial asks Ray for: ``1/K`` for ``--trials-per-gpu K`` (K ≥ 1, not with
    ``--gpus-per-trial``, which says the same another way), else ``--gpus-per-trial`` (None: the
    default of :func:`~studies.preflight.default_gpus_per_trial`)."""
    if trials_per_gpu is None:
        return gpus_per_trial
    if gpus_per_trial is not None:
        raise UsageError(f"--trials-per-gpu {trials_per_gpu} with --gpus-per-trial {gpus_per_trial:g}: give one "
                         "of them (--trials-per-gpu K asks for 1/K of a GPU per trial)")
    if trials_per_gpu < 1:
        raise UsageError(f"--trials-per-gpu {trials_per_gpu}: must be a whole number of trials, at least 1")
    return 1.0 / trials_per_gpu


def _check_workers(workers: int, cells: list[dict], gpus: float | None) -> None:
    """--workers-per-trial N: at least 1, every cell's batch_size (the global batch) splits into N
    equal slices, and with GPUs each worker has a whole one (NCCL refuses two ranks on one
    device); one line otherwise, before Ray starts."""
    if workers > 1 and gpus is not None and 0 < gpus < 1:
        raise UsageError(f"--workers-per-trial {workers} with --gpus-per-trial {gpus:g}: each worker of a "
                         "trial needs a whole GPU (NCCL runs one rank per device)")
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
    for flag, value in (("--max-seeds", args.max_seeds), ("--seed-batch", args.seed_batch)):
        if value is not None and not args.until_decided:
            raise UsageError(f"{flag} {value}: only with --until-decided (it sets how far seeds by need go)")
    if args.until_decided and _max_seeds(args) < 2:
        raise UsageError(f"--max-seeds {args.max_seeds}: at least 2 seeds per cell")
    if args.seed_batch is not None and args.seed_batch < 1:
        raise UsageError(f"--seed-batch {args.seed_batch}: at least 1")
    if args.add_seeds:  # malformed, repeated or too many seeds: refused before --out is touched
        from ..seeds_by_need import parse_seeds

        parse_seeds(args.add_seeds)


def _max_seeds(args: argparse.Namespace) -> int:
    return args.max_seeds if args.max_seeds is not None else DEFAULT_MAX_SEEDS


def _check_output_folders(out: Path, tracking_uri: str, experiment: str, store_flag: str) -> None:
    """The folders a study writes into that exist already take files: Ray's (``ray/``), the
    shared baselines', the artifact folder beside a local store (``mlartifacts/`` and its
    experiment's folder). Checked now, not when the first trial logs its model."""
    from ..planning import BASELINES_DIR
    from ..tracking import default_artifact_root

    artifacts = default_artifact_root(tracking_uri)
    folders = [(out / "ray", "--out"), (out / BASELINES_DIR, "--out"),
               *([(Path(artifacts), store_flag), (Path(artifacts) / experiment, store_flag)] if artifacts else [])]
    for folder, flag in folders:
        if folder.exists() or folder.is_symlink():
            writable_folder(folder, flag)



def _run(args: argparse.Namespace, plan, options, progress, interruption, metric: str, mode: str, study) -> dict:
    """The study's grid, or its seeds by need (studies.seeds_by_need)."""
    from ..progress import StudyProgress
    from ..runner import run_study

    def progress_for(batch_plan):
        return StudyProgress(total=batch_plan.num_trials, header=_run_header(study, batch_plan), metric=metric,
                             mode=mode)

    if args.until_decided:
        from ..seeds_by_need import run_until_decided

        return run_until_decided(plan, options, max_seeds=_max_seeds(args), batch=args.seed_batch,
                                 progress_factory=progress_for, interruption=interruption)
    if args.add_seeds:
        from ..seeds_by_need import add_seeds, parse_seeds

        return add_seeds(plan, options, parse_seeds(args.add_seeds), progress_factory=progress_for,
                         interruption=interruption)
    return run_study(plan, options, progress=progress, interruption=interruption)



def _search_of(args: argparse.Namespace, study):
    """The search ``run`` asks for (None: a grid): the study file's ``search`` block, then
    ``--search``, ``--samples``, ``--metric`` and the ranges among the ``key=value`` pairs."""
    from ..search import make_search, require_optuna, split_ranges

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
