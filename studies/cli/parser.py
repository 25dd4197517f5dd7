"""The argument parser of ``mae-study``: commands, flags, and key=value stragglers."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import NoReturn

from mae_core.config import config_keys

from .plugins import add_plugin_option
from ..search import DEFAULT_METRIC, DEFAULT_SAMPLES
from .bench import cmd_bench
from .catalog import cmd_list, cmd_new_study
from .common import DEFAULT_EXPERIMENT, DEFAULT_OUT, UsageError
from .config import cmd_config
from .evaluate import cmd_evaluate
from .fetch import cmd_fetch
from .report import cmd_report
from .run import cmd_run
from .train import cmd_train
from .variance import cmd_variance


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(message)



def package_version() -> str:
    """The installed ``mae-study`` distribution's version; in a checkout that was never installed,
    the version pyproject.toml declares."""
    from importlib import metadata

    try:
        return metadata.version("mae-study")
    except metadata.PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
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



def _command(commands, name: str, handler, *, plugins: bool = False, **parser_options) -> argparse.ArgumentParser:
    """A sub-command ``name`` answered by ``handler``; ``plugins``: it takes ``--plugin`` (the
    commands that build configs or read a study's parts)."""
    command = commands.add_parser(name, **parser_options)
    command.set_defaults(handler=handler)
    if plugins:
        add_plugin_option(command)
    return command


def add_store_options(command: argparse.ArgumentParser, out_help: str) -> None:
    """--out, --tracking-uri and --experiment: where a study's runs are kept (run, report, evaluate,
    variance); ``train`` has its own, whose --out defaults to the working directory."""
    command.add_argument("--out", default=DEFAULT_OUT, help=out_help)
    command.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite:///<abs --out>/mlflow.db)")
    command.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment name")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mae-study", description="Ablation studies of masked autoencoders.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    # not required here: main() answers a bare ``mae-study`` with the usage itself
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)

    train = _command(commands, "train", cmd_train, plugins=True,
                     help="one run, no Ray", epilog=_config_keys_epilog(),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--config", help="YAML file of config keys (mae-study config --yaml writes one)")
    train.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite file in --out)")
    train.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment name")
    train.add_argument("--out", default=".",
                       help="folder for the MLflow store (mlflow.db, mlartifacts/) and checkpoints/ (default: .)")
    train.add_argument("--resume", action="store_true",
                       help="continue the interrupted run from its checkpoint in --out/checkpoints")
    train.add_argument("--smoke", action="store_true",
                       help="tiny data and steps (the studies' smoke keys; key=value still wins): seconds")
    train.add_argument("--json", action="store_true",
                       help="print the final metrics as one JSON object on stdout (the rest goes to stderr)")
    train.add_argument("overrides", nargs="*", metavar="key=value")

    run = _command(commands, "run", cmd_run, plugins=True,
                   help="a study's grid with Ray Tune")
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
    run.add_argument("--trials-per-gpu", type=int, metavar="K",
                     help="pack K trials on each GPU: every trial asks Ray for 1/K of one (instead of "
                          "--gpus-per-trial 1/K; recorded on the study's parent run)")
    run.add_argument("--workers-per-trial", type=int, default=1,
                     help="train each trial on N Ray Train workers (DDP: gloo on CPUs, NCCL on GPUs), each with "
                          "--cpus-per-trial/--gpus-per-trial; batch_size stays the global batch, split evenly")
    add_store_options(run, "the output folder: the MLflow store (mlflow.db, mlartifacts/) unless --tracking-uri, "
                           "and STUDY[-smoke]/ with study.json, Ray's state and the report (default: mae_runs)")
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
    run.add_argument("--max-seeds", type=int, help="--until-decided: at most this many seeds per cell "
                                                               "(default 20)")
    run.add_argument("--seed-batch", type=int, help="--until-decided: seeds added per look (default: the study's count)")
    run.add_argument("--add-seeds", metavar="SEEDS",
                     help="add seeds (5-9 or 5,6,7) to every cell of the finished study in --out; the report pools them")
    run.add_argument("overrides", nargs="*", metavar="key=value",
                     help="config keys; key=v1,v2 makes an axis; key=KIND:ARGS a range for --search; seeds=0,1,2")

    bench = _command(commands, "bench", cmd_bench,
                     help="speed measurements against a peer, as ratios")
    bench.add_argument("--quick", action="store_true", help="fewer rounds and images")
    bench.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    bench.add_argument("--out", help="results folder (default: benchmarks/results under the working directory)")
    bench.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="cuda: the GPU measurements (ViT-B/16 against transformers, digits run, exact risk)")

    fetch = _command(commands, "fetch", cmd_fetch,
                     help="download a named dataset's official files, checked by SHA-256")
    fetch.add_argument("name", metavar="NAME", help="a named dataset: fashion_mnist")
    fetch.add_argument("--to", metavar="DIR",
                       help="the data folder; the files go to DIR/<dataset> (default: $MAE_STUDY_DATA, else "
                            "~/.local/share/mae-study, where dataset=NAME looks first)")

    new_study = _command(commands, "new-study", cmd_new_study,
                         help="write a commented study file NAME.yaml")
    new_study.add_argument("name")

    config = _command(commands, "config", cmd_config,
                      help="every config key: default, allowed range, meaning")
    config.add_argument("keys", nargs="*", metavar="KEY", help="only these keys (e.g. mask_ratio eval.fewshot)")
    config.add_argument("--yaml", action="store_true",
                        help="print a YAML file of the defaults that train --config accepts")

    listing = _command(commands, "list", cmd_list,
                       help="the built-in studies and the study files here")

    report = _command(commands, "report", cmd_report, plugins=True,
                      help="tables and figures of a study from MLflow")
    report.add_argument("study", nargs="?")
    report.add_argument("--compare", metavar="OLD_REPORT_DIR",
                        help="after writing the report, print every claim whose verdict changed since the "
                             "report in OLD_REPORT_DIR (its claims.csv), with both n, effects and intervals")
    report.add_argument("--paper", nargs="+", metavar="STUDY[=STORE]",
                        help="MAE Table 1 with a sub-table per study (in this order) and Figure 5; "
                             "STORE: a tracking URI, an mlflow.db or its folder (default: --out's mlflow.db), "
                             "or the trials.csv of a report")
    add_store_options(report, "the study's output folder, as given to run: its mlflow.db is read (default: mae_runs)")
    report.add_argument("--report-dir", help="where the report goes (default: OUT/STUDY/report, "
                                             "OUT/STUDY-smoke/report with --smoke, OUT/paper with --paper)")
    report.add_argument("--smoke", action="store_true",
                        help="report a smoke run (without it only full runs are read; a smoke report says so)")
    report.add_argument("--format", default="png,pdf", help="figure formats: png,pdf,svg")
    report.add_argument("--run", metavar="PARENT_RUN_ID",
                        help="report this run of the study (default: its newest full run, or smoke run with --smoke)")

    evaluate = _command(commands, "evaluate", cmd_evaluate, plugins=True,
                        help="stored encoders evaluated again with other eval.* keys, no training")
    evaluate.add_argument("study", nargs="?", help="every finished trial of the study's newest run (or --run ID)")
    evaluate.add_argument("--run", metavar="RUN_ID", help="one run (a trial, or a train run) instead of a study")
    add_store_options(evaluate, "the folder run wrote: its mlflow.db is read and written (default: mae_runs)")
    evaluate.add_argument("--smoke", action="store_true", help="the study's newest smoke run (without it: full runs)")
    evaluate.add_argument("overrides", nargs="*", metavar="eval.key=value",
                          help="evaluation keys only (eval.knn_ks=5,20: a comma is part of the value)")

    variance = _command(commands, "variance", cmd_variance, plugins=True,
                        help="each seed source (seed_data, seed_init, seed_masks, seed_eval) varied alone at one "
                             "cell: its variance component per metric, with intervals (variance.csv)")
    variance.add_argument("study", help="a built-in study (mae-study list) or a study file (my_study.yaml)")
    variance.add_argument("--cell", action="extend", nargs="+", metavar="key=value",
                          help="the cell: a value per axis (axes left out keep the reference cell's; "
                               "default: the study's reference cell)")
    variance.add_argument("--levels", type=int, metavar="K",
                          help="trials per source: that seed at s+1..s+K, the others at the study's first seed s "
                               "(default 5)")
    variance.add_argument("--smoke", action="store_true", help="tiny data and steps: seconds")
    variance.add_argument("--resume", action="store_true", help="continue an interrupted design")
    variance.add_argument("--max-concurrent", type=int, help="at most this many trials at once")
    add_store_options(variance, "the output folder, as for run: the design runs in STUDY_variance[-smoke]/, "
                                "variance.csv and its figure go to STUDY[-smoke]/variance/ (default: mae_runs)")
    return parser



def _no_command(parser: argparse.ArgumentParser) -> NoReturn:
    """A bare ``mae-study``: the usage, then the one-line error (exit status 2)."""
    parser.print_help(sys.stderr)
    raise UsageError("no command given; try: mae-study train --smoke")



def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
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
