"""``mae-study run --trials-per-gpu K`` (issue 36): 1/K of a GPU per trial; refused with one line
beside --gpus-per-trial or below 1, before Ray starts (the packing itself:
tests/scenarios/test_gpu_packing.py)."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from studies.cli import main
from studies.cli.run import gpus_of_trials_per_gpu


@pytest.mark.parametrize("k, share", [(1, 1.0), (2, 0.5), (8, 0.125)])
def test_k_trials_per_gpu_ask_for_one_kth_of_a_gpu_each(k, share):
    assert gpus_of_trials_per_gpu(k, None) == share


def test_without_the_flag_the_gpus_per_trial_stand():
    assert gpus_of_trials_per_gpu(None, 0.25) == 0.25 and gpus_of_trials_per_gpu(None, None) is None


@pytest.mark.parametrize("flags, says", [
    (["--trials-per-gpu", "2", "--gpus-per-trial", "0.5"], "--trials-per-gpu 2 with --gpus-per-trial 0.5: give one"),
    (["--trials-per-gpu", "0"], "--trials-per-gpu 0: must be a whole number of trials, at least 1"),
    pytest.param(["--trials-per-gpu", "2"],
                 "--trials-per-gpu 2 (0.5 GPU per trial): each trial asks for 0.5 GPU(s) but this machine has 0",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU refuses it")),
])
def test_bad_trials_per_gpu_is_one_line_and_exit_2(tmp_path, flags, says):
    err = io.StringIO()
    with contextlib.chdir(tmp_path), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(["run", "mask_ratio", "--smoke", "--out", "out", *flags])
        except SystemExit as stop:
            status = stop.code
    lines = err.getvalue().strip().splitlines()
    assert status == 2 and len(lines) == 1 and says in lines[0], err.getvalue()
    assert not (tmp_path / "out" / "mlflow.db").exists()  # before any store or Ray
