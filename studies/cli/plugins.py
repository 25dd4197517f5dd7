"""The ``--plugin`` option of ``train``, ``run``, ``evaluate`` and ``report`` (:mod:`mae_core.plugins`)."""

from __future__ import annotations

import argparse


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE.py",
                        help="import a module or .py file that registers its own objectives, targets, corruptions, "
                             "mask samplers, dataset formats or encoders (mae_core.registry); repeatable")


def load_command_plugins(args: argparse.Namespace) -> None:
    """A command with the option loads its plugins (and the entry-point group's) before any
    config is read; the others (config, list, --help) stay free of a plugin's imports."""
    if hasattr(args, "plugin"):
        from mae_core.plugins import load_plugins

        load_plugins(args.plugin)
