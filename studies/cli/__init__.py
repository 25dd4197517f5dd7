"""The ``mae-study`` command line.

Bad input exits with status 2 and one line naming the problem, before Ray starts or an MLflow
run is created; a run that fails while training exits with status 1.

Only light modules are imported here (the typed config imports no torch): torch, Ray and
MLflow are imported inside the commands that use them, so ``--help``, ``--version`` and
``config`` answer at once.

One module per command (train, run, report, evaluate, config, catalog, bench, fetch), the parser, the
--plugin option (plugins), what they share (common) and the environment defaults (studies.environment).
"""

from __future__ import annotations

import sys

from mae_core.errors import UserError

from ..environment import quiet_libraries
from .plugins import load_command_plugins
from .common import BAD_INPUT, DEFAULT_EXPERIMENT, DEFAULT_OUT, UsageError, fail, resolve_config
from .config import defaults_yaml
from .parser import build_parser, package_version, parse

__all__ = ["BAD_INPUT", "DEFAULT_EXPERIMENT", "DEFAULT_OUT", "UsageError", "build_parser", "defaults_yaml",
           "main", "package_version", "resolve_config"]


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()
    try:
        parser = build_parser()
        args = parse(parser, argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        load_command_plugins(args)
        return args.handler(args)
    except UserError as error:  # every error a user can cause and fix: one line, exit 2
        fail(str(error))
    except KeyboardInterrupt:  # before any run was created: nothing to record or resume
        print("mae-study: interrupted before anything was recorded", file=sys.stderr)
        return 130
