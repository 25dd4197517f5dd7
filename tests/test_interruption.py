"""SIGINT is remembered even where Python swallows its KeyboardInterrupt (studies.interrupts)."""

from __future__ import annotations

import os
import signal

import pytest

from studies.interrupts import Interruption, sigterm_as_sigint


def test_a_sigint_swallowed_by_a_callback_is_still_requested():
    # In the full suite a SIGINT landed in logging's fork handler while Ray started its processes
    # ("Exception ignored in: _releaseLock"): the KeyboardInterrupt was dropped and the study ran
    # on to success. The handler now records the signal, and the runner asks once Ray is up.
    interruption = Interruption()
    before = signal.getsignal(signal.SIGINT)  # whatever an earlier test left
    with sigterm_as_sigint(interruption):
        try:  # what an ignored-exception callback does with it
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        except KeyboardInterrupt:
            pass
        assert interruption.requested() and interruption.reason == "SIGINT"
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_sigterm_is_remembered_as_sigterm_and_raised_as_keyboard_interrupt():
    interruption = Interruption()
    with sigterm_as_sigint(interruption), pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes
            pass
    assert interruption.reason == "SIGTERM"


def test_the_runner_stops_when_ray_start_up_swallowed_the_signal(tmp_path, monkeypatch):
    from studies import runner
    from studies.named_studies import get_study

    interruption = Interruption()

    def start_ray_swallowing_a_sigint(address):  # as ray.init's forks did
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        except KeyboardInterrupt:
            pass
        return False

    monkeypatch.setattr(runner, "start_ray", start_ray_swallowing_a_sigint)
    plan = runner.plan_study(get_study("mask_ratio"), smoke=True, overrides={"seed": [0]})  # 2 cells
    options = runner.RunOptions(out_dir=tmp_path, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    with sigterm_as_sigint(interruption), pytest.raises(runner.StudyInterrupted):
        runner.run_study(plan, options, interruption=interruption)
    state = runner.load_state(tmp_path)
    assert state["complete"] is False and state["interrupted"] == "SIGINT"
