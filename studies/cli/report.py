"""``mae-study report``: a study's report from its MLflow runs, or a paper's from several."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..study import check_study_name
from .common import UsageError, check_readable_store, default_uri, study_folder, ui_command, writable_folder


def cmd_report(args: argparse.Namespace) -> int:
    """Reads only the MLflow store: any study that logged runs there can be reported. The store
    is the one ``run --out`` wrote (``--out``'s ``mlflow.db``) unless ``--tracking-uri`` names
    another; only full runs are read, or with ``--smoke`` only smoke runs."""
    from analysis.report import write_report

    if args.paper:
        return _report_paper(args)
    if args.study is None:
        raise UsageError("report needs a STUDY (or --paper STUDY[=STORE] ... for MAE Table 1 over several)")
    check_study_name(args.study, "study")
    formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
    bad = [f for f in formats if f not in ("png", "pdf", "svg")]
    if bad or not formats:
        raise UsageError(f"--format {args.format}: allowed formats are png, pdf, svg")
    root = Path(args.out)
    tracking_uri = args.tracking_uri or default_uri(root)
    from .. import tracking

    store = tracking.missing_sqlite_store(tracking_uri)
    if store is not None:
        older = Path(tracking.STORE_FILE).resolve()  # where run put the store before --out held it
        hint = (f"; the store in this folder is read with --tracking-uri sqlite:///{older}"
                if older.is_file() and older != store else "")
        raise UsageError(f"no runs of study {args.study}: no MLflow store at {store} (--out is the folder "
                         f"`mae-study run --out` wrote, the report's own folder is --report-dir){hint}")
    check_readable_store(tracking_uri)
    old_claims = _old_claims(args.compare) if args.compare else None
    # made by write_report once the run is found: a refused report leaves no folder behind
    out = Path(args.report_dir) if args.report_dir else study_folder(root, args.study, args.smoke) / "report"
    from analysis.variance import VARIANCE_DIR

    index = write_report(args.study, tracking_uri, out, formats=formats, experiment=args.experiment,
                         parent_run_id=args.run, smoke=args.smoke,
                         variance_dir=study_folder(root, args.study, args.smoke) / VARIANCE_DIR)
    print(f"report: {index}")
    if old_claims is not None:
        _print_claim_changes(index.parent, old_claims, args.compare)
    print(f"next: {ui_command(tracking_uri)}", file=sys.stderr)
    return 0



COMPARED_COLUMNS = {"claim": "text", "cell": "text", "verdict": "text", "n": "number", "effect": "number",
                    "ci_low": "number", "ci_high": "number"}  # what --compare reads of an old claims.csv


def _old_claims(folder: str):
    """The claims.csv of an earlier report (checked before anything is written): a table with
    :data:`COMPARED_COLUMNS`, ``n`` a count on every row; one line naming the file otherwise."""
    import pandas as pd

    path = Path(folder) / "claims.csv"
    if not path.is_file():
        raise UsageError(f"--compare {folder}: no claims.csv there (a report folder written by mae-study report)")
    what = f"--compare {path}: not a claims.csv written by mae-study report"
    try:
        old = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"{what} ({type(error).__name__})") from None
    missing = [column for column in COMPARED_COLUMNS if column not in old]
    if missing:
        raise UsageError(f"{what} (no column {', '.join(missing)})")
    for column, kind in COMPARED_COLUMNS.items():
        if kind == "number":
            old[column] = pd.to_numeric(old[column], errors="coerce")
    if old["n"].isna().any() or (old["n"] < 0).any():
        raise UsageError(f"{what} (column n: a count of seeds on every row)")
    return old


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
    sources = parse_sources(args.paper, args.tracking_uri or default_uri(Path(args.out)))
    from ..tracking import missing_sqlite_store

    for source in sources:
        store = missing_sqlite_store(source.tracking_uri)
        if store is not None:
            raise UsageError(f"no runs of study {source.study}: no MLflow store at {store} "
                             f"(give it as {source.study}=STORE, or pass --tracking-uri)")
        check_readable_store(source.tracking_uri)
    out = writable_folder(Path(args.report_dir) if args.report_dir else Path(args.out) / "paper", "--report-dir")
    from ..named_studies import get_study

    paths = write_paper(sources, out, formats=formats, experiment=args.experiment, smoke=args.smoke,
                        find_study=get_study)
    print("paper: " + ", ".join(str(p) for p in paths))
    print(f"next: cd {shlex.quote(str(out))} && pdflatex paper_preview.tex")
    return 0
