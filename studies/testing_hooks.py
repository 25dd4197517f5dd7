"""Test-only hooks: where an interrupt test holds a run so that it signals it at a known point,
instead of racing a timer against a fast machine. Nothing here runs unless its environment
variable is set (tests/scenarios/test_interrupts.py sets them); the training loop reaches the one
it needs only through ``train(after_update=...)``, so the engine holds no test code.

* ``MAE_TEST_PAUSE_AT_STEP=N``: every trial's loop holds after update N (its log and
  checkpoint written) until a stop is asked or the process is killed;
* ``MAE_TEST_PAUSE_IN_EVALUATION=1``: a trial holds at the start of its evaluation;
* ``MAE_TEST_PAUSE_BETWEEN_LOOKS=1``: a sequential study's driver holds after recording a look.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

PAUSE_VARIABLE = "MAE_TEST_PAUSE_AT_STEP"
PAUSE_EVALUATION_VARIABLE = "MAE_TEST_PAUSE_IN_EVALUATION"
PAUSE_BETWEEN_LOOKS_VARIABLE = "MAE_TEST_PAUSE_BETWEEN_LOOKS"


def hold(should_stop: Callable[[], bool] | None, limit_s: float = 900.0) -> None:
    """Hold until ``should_stop()`` says yes, the process is killed, or ``limit_s`` passes."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not (should_stop is not None and should_stop()):
        time.sleep(0.05)


def pause_after_update(should_stop: Callable[[], bool] | None) -> Callable[[int], None] | None:
    """The loop's ``after_update(done)`` callback that holds after update N of
    ``MAE_TEST_PAUSE_AT_STEP`` (read once per run), or None when the variable is not set."""
    value = os.environ.get(PAUSE_VARIABLE)
    if not value:
        return None
    pause_at = int(value)

    def after_update(done: int) -> None:
        if done == pause_at:
            hold(should_stop)
    return after_update


def hold_in_evaluation() -> None:
    """Hold a trial at the start of its evaluation when ``MAE_TEST_PAUSE_IN_EVALUATION`` is set."""
    if os.environ.get(PAUSE_EVALUATION_VARIABLE):
        hold(None)


def hold_between_looks(should_stop: Callable[[], bool] | None) -> None:
    """Hold a sequential study's driver after a look when ``MAE_TEST_PAUSE_BETWEEN_LOOKS`` is set."""
    if os.environ.get(PAUSE_BETWEEN_LOOKS_VARIABLE):
        hold(should_stop)
