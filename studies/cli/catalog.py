"""``mae-study list`` and ``new-study``: the studies there are, and a template for your own."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..study import check_study_name


def cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..named_studies import STUDIES
    from ..study_files import StudyFileError, load_study_file, local_files

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
                      str(study.grid_size() * samples), str(study.smoke().grid_size() * samples))

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
    from ..study_files import write_template

    check_study_name(args.name, "study")
    path = write_template(args.name, Path.cwd())
    print(f"wrote {path}; next: mae-study run {path.name} --smoke")
    return 0
