"""Ctrl-C and SIGTERM: stop cleanly, record what happened, and say how to resume.

An interrupted command never reports success: its MLflow runs end KILLED with the signal as the
``interrupted`` tag, a study stays ``complete: false``, and the command prints the exact
``--resume`` command and exits with :data:`EXIT_INTERRUPTED` (128 + SIGINT, as shells do).

SIGTERM is turned into SIGINT, so both take the same path: Python's ``KeyboardInterrupt``, or,
while Ray Tune's loop runs, Ray's own graceful stop (it saves the experiment state so
``Tuner.restore`` and hence ``--resume`` can continue it).
"""

from __future__ import annotations

import shlex
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

EXIT_INTERRUPTED = 130


class Interruption:
    """Which signal arrived, and whether the training loop may finish its current update first.

    While :meth:`deferred` is active the first signal only sets :attr:`signal_name` (the loop
    polls :meth:`requested` after each update, checkpoints and stops); outside it, or at a
    second signal, the signal raises ``KeyboardInterrupt`` at once.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._deferring = False

    def requested(self) -> bool:
        return self.signal_name is not None

    @property
    def reason(self) -> str:
        return self.signal_name or "SIGINT"

    def _handle(self, signum: int, frame) -> None:
        first = self.signal_name is None
        self.signal_name = signal.Signals(signum).name
        if not (first and self._deferring):
            raise KeyboardInterrupt(self.signal_name)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Let the first signal wait for the end of the current update. A signal that arrives
        after the loop's last look (the run's final update) is raised when the block ends."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self.requested():
            raise KeyboardInterrupt(self.signal_name)

    @contextmanager
    def installed(self) -> Iterator[Interruption]:
        """Handle SIGINT and SIGTERM with this object for the duration of the block."""
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


    def _forward_sigterm(self, signum: int, frame) -> None:
        self.signal_name = self.signal_name or signal.Signals(signum).name
        signal.raise_signal(signal.SIGINT)

    def _record_sigint(self, signum: int, frame) -> None:
        self.signal_name = self.signal_name or signal.Signals(signum).name
        raise KeyboardInterrupt(self.signal_name)

    def forward_sigterm(self) -> None:
        """(Re)install SIGTERM -> SIGINT; ``ray.init`` replaces the handler with its own, which
        would kill the driver without recording anything, so the runner calls this after it."""
        signal.signal(signal.SIGTERM, self._forward_sigterm)


@contextmanager
def sigterm_as_sigint(interruption: Interruption) -> Iterator[Interruption]:
    """SIGTERM becomes SIGINT (remembered as SIGTERM). SIGINT raises ``KeyboardInterrupt`` and is
    remembered too: Python drops an exception raised inside a callback it ignores errors from (a
    fork handler while Ray starts its processes printed "Exception ignored in: _releaseLock" and
    the study ran on to success), so the runner also asks :meth:`Interruption.requested` once
    Ray is up. While Ray Tune's loop runs, its own handler makes the stop graceful."""
    previous_int = signal.getsignal(signal.SIGINT)
    previous_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, interruption._record_sigint)
    interruption.forward_sigterm()
    try:
        yield interruption
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)  # Ray Tune leaves its own handler behind


def command_line(words: Sequence[str]) -> str:
    """A copy-pasteable shell command."""
    return shlex.join(words)
