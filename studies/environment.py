"""Environment defaults, the one place they are set (the command line, the runner's Ray start and
the test suite all call :func:`quiet_libraries`). Set before Ray or MLflow start, so Ray's
workers inherit them; a variable the user set is left as it is."""

from __future__ import annotations

import logging
import os

DEFAULTS = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage statistics sent, no notice about them
    "RAY_AUTH_MODE": "disabled",  # a local Ray of our own: no token, no notice
    # Ray Tune's classic output honours verbose=0: no configuration box and TensorBoard hint per study
    "RAY_AIR_NEW_OUTPUT": "0",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # a report's downloads
    # MLflow sets its own level on import; the variable keeps schema-creation chatter away
    # from this process and from Ray's workers
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


def quiet_libraries() -> None:
    """No library chatter on the console, unless the user set these variables."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
