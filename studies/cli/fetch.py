"""``mae-study fetch NAME [--to DIR]``: a named dataset's official files, checked (studies.fetch)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import UsageError


def cmd_fetch(args: argparse.Namespace) -> int:
    from mae_core.data import DataError
    from mae_core.named_datasets import DATA_ENV, NAMED, data_home, locate

    from ..fetch import fetch

    if args.name not in NAMED:
        raise UsageError(f"fetch {args.name}: not a named dataset; known: {', '.join(NAMED)}")
    dataset = NAMED[args.name]
    to = Path(args.to).expanduser() if args.to else data_home()
    folder = fetch(dataset, to)
    print(f"{dataset.name}: {len(dataset.sha256)} files in {folder}, each checked against its SHA-256")
    try:
        found = locate(dataset.name) == folder
    except DataError:
        found = False
    # where the lookup finds it, the name is enough; elsewhere, say where it is
    where = "" if found else f"{DATA_ENV}={to.resolve()} "
    print(f"next: {where}mae-study train dataset={dataset.name} --smoke", file=sys.stderr)
    return 0
