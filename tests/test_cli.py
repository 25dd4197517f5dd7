"""The command line: bad input is refused with one line and exit status 2, before any run exists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from studies.cli import main


def mae_study(*args: str, capsys) -> tuple[int, str]:
    """Run the CLI in this process (start-up would dominate otherwise): (exit status, stderr)."""
    try:
        status = main(list(args))
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    files = {
        "yaml": root / "bad.yaml", "list_yaml": root / "list.yaml",
        "rank": root / "rank.npz", "nan": root / "nan.npz", "empty": root / "empty.npz",
        "a_file": root / "a_file",
    }
    files["yaml"].write_text("mask_ratio: [0.5\n")
    files["list_yaml"].write_text("- 1\n- 2\n")
    np.savez(files["rank"], images=np.zeros((4, 8), np.float32), labels=np.zeros(4, np.int64))
    nan = np.random.default_rng(0).random((10, 1, 8, 8)).astype(np.float32)
    nan[0, 0, 0, 0] = np.nan
    np.savez(files["nan"], images=nan, labels=np.zeros(10, np.int64))
    np.savez(files["empty"], images=np.zeros((0, 1, 8, 8), np.float32), labels=np.zeros(0, np.int64))
    files["a_file"].write_text("not a folder")
    return files


# (arguments, words the one line must contain); {name} is replaced by the path of a bad file
BAD_INVOCATIONS = [
    (["train", "mask_ratio=0"], "mask_ratio"),
    (["train", "mask_ratio=1"], "mask_ratio"),
    (["train", "mask_ratio=-0.5"], "mask_ratio"),
    (["train", "mask_ratio=0.99"], "k must lie in [1, 15]"),
    (["train", "patch_size=3"], "patch_size"),
    (["train", "objective=vae"], "objective"),
    (["train", "target=foo"], "target"),
    (["train", "objective=dae", "corruption=blur"], "corruption"),
    (["train", "dataset=mnist"], "dataset"),
    (["train", "mask_sampling=spiral"], "mask_sampling"),
    (["train", "mask_ration=0.5"], "unknown key 'mask_ration'"),
    (["train", "steps=many"], "steps"),
    (["train", "lr=0"], "lr"),
    (["train", "lr=-1"], "lr"),
    (["train", "steps=-1"], "steps"),
    (["train", "batch_size=0"], "batch_size"),
    (["train", "dataset=shapes", "target=norm"], "norm_eps"),
    (["train", "dataset=npz:/no/such/file.npz"], "/no/such/file.npz"),
    (["train", "dataset=npz:{rank}"], "rank.npz"),
    (["train", "dataset=npz:{nan}"], "nan.npz"),
    (["train", "dataset=npz:{empty}"], "empty.npz"),
    (["train", "--config", "{yaml}"], "not valid YAML"),
    (["train", "--config", "{list_yaml}"], "mapping"),
    (["train", "--config", "/no/such.yaml"], "no such file"),
    (["train", "mask_ratio"], "key=value"),
    (["train", "compile=maybe"], "compile='maybe': must be auto, true or false"),
    (["train", "--out", "{a_file}/sub"], "cannot be written"),
    (["run", "no_such_study", "--smoke"], "unknown study"),
    (["run", "mask_ratio", "--smoke", "mask_ratio=2"], "mask_ratio"),
    (["run", "mask_ratio", "--smoke", "--resume"], "no study to resume"),
    (["run", "mask_ratio", "--smoke", "--address", "127.0.0.1:1"], "no Ray cluster reachable"),
    (["run", "mask_ratio", "--smoke", "--resume", "steps=7"], "the grid differs"),
    (["run", "mask_ratio", "--smoke", "steps=7"], "holds an unfinished study"),
    (["run", "mask_ratio", "--smoke", "--max-concurrent", "0"], "--max-concurrent"),
    (["run", "mask_ratio", "--smoke", "--gpus-per-trial", "1"], "--gpus-per-trial 1: each trial asks for 1 GPU(s) but this machine has 0"),
    (["run", "mask_ratio", "--smoke", "--cpus-per-trial", "4096"], "--cpus-per-trial 4096"),
    (["report", "mask_ratio"], "mask_ratio"),
    (["report", "no_such_study"], "no_such_study"),
    (["report", "../../etc"], "study name"),
    (["report", "mask_ratio", "--format", "gif"], "--format"),
    (["bogus"], "invalid choice"),
]


@pytest.mark.parametrize("args,words", BAD_INVOCATIONS, ids=[" ".join(a) for a, _ in BAD_INVOCATIONS])
def test_bad_input_is_one_line_and_exit_2(args, words, bad_files, tmp_path, monkeypatch, capsys):
    import ray

    monkeypatch.chdir(tmp_path)
    if "steps=7" in args:  # an interrupted smoke study whose grid had the default steps
        from studies.registry import get_study
        from studies.runner import save_state
        from studies.study import cell_id

        cells = get_study("mask_ratio").cells(smoke=True)
        save_state(tmp_path / "mae_runs" / "mask_ratio-smoke",
                   {"cells": sorted(cell_id(c) for c in cells), "ray_path": str(tmp_path / "ray")})
    args = [a.format(**{k: str(v) for k, v in bad_files.items()}) for a in args]
    status, err = mae_study(*args, capsys=capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert words in lines[0]
    assert not (tmp_path / "mlflow.db").exists(), "no MLflow store is created for bad input"
    assert not ray.is_initialized(), "Ray never started"
