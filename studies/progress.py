"""Live study progress on the terminal: trials done / running / failed, best so far, time.

The time left is this session's pace (seconds per trial finished since the study started or
was resumed) times the trials still to run, so the downtime before a ``--resume`` and the trials
finished before it do not skew it.
"""

from __future__ import annotations

import sys
import time

from ray.tune import Callback

from evaluation.metrics import RISK_MEANING_AXES  # a "best so far" across these compares unlike numbers


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


ENDED = ("TERMINATED", "ERROR")  # Ray Tune's statuses of a trial that will not run again


def progress_metric(axes) -> str | None:
    """The metric whose best value the progress line may show for a grid over ``axes``."""
    return None if set(RISK_MEANING_AXES) & set(axes) else "test_mae_risk"


class StudyProgress(Callback):
    """Prints one line whenever a trial starts, finishes or fails (plain text: it must pickle,
    because Ray stores the run configuration for ``--resume``). ``metric=None`` shows no best."""

    def __init__(self, total: int, header: str = "", metric: str | None = "test_mae_risk", mode: str = "min"):
        self.total, self.header, self.metric, self.mode = total, header, metric, mode
        self._new_session()

    def _new_session(self) -> None:
        """Counters of this process's session (Ray restores this object on ``--resume``)."""
        self.started_at = time.monotonic()
        self.running: set[str] = set()
        self.done: set[str] = set()
        self.failed: set[str] = set()
        self.best: tuple[float, str] | None = None
        self.before: int | None = None  # trials that had ended before this session (a resume)

    def setup(self, **info):
        self._new_session()  # a resumed study: the time and trials before it are not this pace
        if self.header:
            print(self.header, file=sys.stderr, flush=True)

    def _line(self, event: str, trials=()) -> None:
        if self.before is None:  # first event of the session: Ray's restored trials that had ended
            ours = self.running | self.done | self.failed
            self.before = sum(1 for t in trials if getattr(t, "status", None) in ENDED and t.trial_id not in ours)
        elapsed = time.monotonic() - self.started_at
        ended_now = len(self.done) + len(self.failed)
        finished = self.before + ended_now
        remaining = ""
        if ended_now:
            left = elapsed / ended_now * max(0, self.total - finished)
            remaining = f", about {_duration(left)} left"
        best = f" | best {self.metric} {self.best[0]:.4g} ({self.best[1]})" if self.best else ""
        print(f"[{finished}/{self.total} done, {len(self.running)} running, {len(self.failed)} failed]"
              f" {event}{best} | {_duration(elapsed)} elapsed{remaining}", file=sys.stderr, flush=True)

    def on_trial_start(self, iteration, trials, trial, **info):
        self.running.add(trial.trial_id)
        self._line(f"started {_label(trial)}", trials)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.running.discard(trial.trial_id)
        result = trial.last_result or {}
        if result.get("diverged") == 1.0:
            self.failed.add(trial.trial_id)
            self._line(f"diverged {_label(trial)}: {result.get('failure_reason', '')}", trials)
            return
        self.done.add(trial.trial_id)
        if "train_seconds" not in result:  # a scheduler (ASHA) ended it before its evaluation
            self._line(f"stopped early {_label(trial)}", trials)
            return
        value = result.get(self.metric) if self.metric else None
        if value is not None and value == value:
            better = self.best is None or (value < self.best[0] if self.mode == "min" else value > self.best[0])
            if better:
                self.best = (float(value), _label(trial))
        self._line(f"finished {_label(trial)}", trials)

    def on_trial_error(self, iteration, trials, trial, **info):
        self.running.discard(trial.trial_id)
        self.failed.add(trial.trial_id)
        self._line(f"error in {_label(trial)}", trials)


def _label(trial) -> str:
    from .study import trial_keys  # a zipped group's row shows as its keys

    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in trial_keys(trial.config or {}).items())
