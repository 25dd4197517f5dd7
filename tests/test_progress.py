"""The live progress lines: what each trial's end is called, and the best value so far."""

from __future__ import annotations

from types import SimpleNamespace

from studies.progress import StudyProgress


def trial(trial_id: str, ratio: float, **result) -> SimpleNamespace:
    return SimpleNamespace(trial_id=trial_id, config={"mask_ratio": ratio}, last_result=result)


def test_each_end_of_a_trial_is_named_and_counted(capsys):
    progress = StudyProgress(total=4)
    ends = [trial("a", 0.5, train_seconds=3.0, test_mae_risk=0.07),
            trial("b", 0.75, train_seconds=3.0, test_mae_risk=0.05),
            trial("c", 0.9, train_loss=0.3),  # stopped by ASHA before its evaluation
            trial("d", 0.25, diverged=1.0, failure_reason="non-finite loss at step t=3")]
    for t in ends:
        progress.on_trial_start(0, [], t)
        progress.on_trial_complete(0, [], t)
    lines = [line for line in capsys.readouterr().err.splitlines() if "started" not in line]
    assert "finished mask_ratio=0.5" in lines[0]
    assert "finished mask_ratio=0.75" in lines[1] and "best test_mae_risk 0.05 (mask_ratio=0.75)" in lines[1]
    assert "stopped early mask_ratio=0.9" in lines[2] and "best test_mae_risk 0.05" in lines[2]
    assert "diverged mask_ratio=0.25: non-finite loss" in lines[3]
    assert lines[3].startswith("[4/4 done, 0 running, 1 failed]")


def test_no_best_is_shown_across_cells_whose_risks_mean_different_things(capsys):
    from studies.progress import progress_metric

    assert progress_metric({"decoder_depth": [1, 2], "seed": [0]}) == "test_mae_risk"
    for axis in ("mask_ratio", "target", "dataset", "patch_size"):
        assert progress_metric({axis: [1, 2], "seed": [0]}) is None
    progress = StudyProgress(total=1, metric=None)
    progress.on_trial_complete(0, [], trial("a", 0.5, train_seconds=3.0, test_mae_risk=0.07))
    assert "best" not in capsys.readouterr().err


def test_after_a_resume_the_time_left_ignores_the_downtime_and_the_trials_done_before(capsys, monkeypatch):
    """Ray restores the callback pickled when the study started: its clock and counts are the
    first session's. The pace after ``--resume`` is this session's alone."""
    import pickle

    clock = [1_000.0]
    monkeypatch.setattr("studies.progress.time.monotonic", lambda: clock[0])
    first = StudyProgress(total=4)
    restored = pickle.loads(pickle.dumps(first))
    clock[0] += 3 * 3600  # three hours down between the interruption and --resume
    restored.setup()
    done_before = [SimpleNamespace(trial_id=i, config={"mask_ratio": r}, last_result={}, status="TERMINATED")
                   for i, r in (("a", 0.25), ("b", 0.5))]
    c = trial("c", 0.75, train_seconds=3.0, test_mae_risk=0.05)
    d = trial("d", 0.9, train_seconds=3.0, test_mae_risk=0.06)
    c.status = d.status = "RUNNING"
    trials = [*done_before, c, d]
    restored.on_trial_start(0, trials, c)
    restored.on_trial_start(0, trials, d)
    clock[0] += 60  # c takes a minute
    restored.on_trial_complete(0, trials, c)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("[3/4 done, 1 running, 0 failed] finished mask_ratio=0.75"), line
    assert line.endswith("| 1m00s elapsed, about 1m00s left"), line  # one trial left at a minute each
