"""What every command shares: the exit status and one-line error for bad input, the config a
command line resolves to, output folders, and the commands printed as next steps.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NoReturn

from mae_core import files
from mae_core.config import Config, parse_overrides
from mae_core.errors import UserError

BAD_INPUT = 2


BAD_INPUT = 2
DEFAULT_OUT = "mae_runs"  # run's and report's --out: the output folder of studies


DEFAULT_OUT = "mae_runs"  # run's and report's --out: the output folder of studies
DEFAULT_EXPERIMENT = "mae-study"  # (studies.tracking.DEFAULT_EXPERIMENT, without importing MLflow)



class UsageError(UserError):
    """Bad input: printed as one line, exit status 2."""



def fail(message: str, status: int = BAD_INPUT) -> NoReturn:
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



@contextmanager
def removed_if_refused(*folders: Path) -> Iterator[None]:
    """A refusal (a :class:`UserError`) inside the block leaves none of ``folders`` that the block
    created: those that did not exist before and are empty now are removed, deepest first."""
    new = {path for folder in folders for path in (folder.absolute(), *folder.absolute().parents)
           if not path.exists()}  # with the missing folders above them
    try:
        yield
    except UserError:
        for folder in sorted(new, key=lambda f: len(f.parts), reverse=True):
            with suppress(OSError):  # not empty, or gone: left as it is
                folder.rmdir()
        raise


def same_command(args: argparse.Namespace, *, resume: bool) -> str:
    """The command the user typed, with ``--resume`` added (or removed)."""
    from ..interrupts import command_line

    words = [word for word in args.argv if word != "--resume"]
    return command_line(["mae-study", *words, *(["--resume"] if resume else [])])



def study_folder(root: Path, study: str, smoke: bool) -> Path:
    """A study's own folder under ``--out``: its ``study.json``, Ray's state (``ray/``) and its
    report (``report/``); smoke runs apart (``STUDY-smoke``), so they never meet a full run's state.
    The name must be a safe study name, and the folder, resolved (links followed), a folder
    inside ``--out``: nothing a name spells is written or read outside it."""
    from ..study import check_study_name

    check_study_name(study, "study folder")
    folder = root / (study + ("-smoke" if smoke else ""))
    inside = root.resolve()
    if inside not in folder.resolve().parents:
        raise UsageError(f"study {study}: its folder {folder} resolves to {folder.resolve()}, outside --out {inside}")
    return folder



def check_readable_store(tracking_uri: str) -> None:
    """One line naming the SQLite file when ``tracking_uri``'s store exists but cannot be read
    (garbage, truncated, another database), before MLflow opens it (its traceback runs 17-84 lines)."""
    from ..tracking import sqlite_path, unreadable_sqlite_store

    problem = unreadable_sqlite_store(tracking_uri)
    if problem is not None:
        raise UsageError(f"{sqlite_path(tracking_uri)}: cannot be read as an MLflow store ({problem}); "
                         "restore it from a copy, or name another with --tracking-uri")



def report_command(args: argparse.Namespace, study: str, parent_run_id: str) -> str:
    """The ``mae-study report`` command for the study ``run`` just ran, with the same ``--out``,
    ``--tracking-uri`` and ``--experiment``, ``--smoke`` for a smoke run, and its parent run id."""
    from ..interrupts import command_line

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
    from ..interrupts import command_line

    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri} in a browser"
    return command_line(["mlflow", "ui", "--backend-store-uri", tracking_uri, "--host", "127.0.0.1"])



def default_uri(folder: Path) -> str:
    from ..tracking import default_tracking_uri

    return default_tracking_uri(folder)
