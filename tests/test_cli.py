"""The command line: bad input is refused with one line and exit status 2, before any run exists."""

from __future__ import annotations

from pathlib import Path

import json
import subprocess
import sys
import tomllib
from importlib import metadata

import numpy as np
import pytest
import yaml

from mae_core.config import Config, EvalConfig

from conftest import own_ray
from studies.cli import main, package_version, resolve_config


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
    (["train", "encoder=bogus"], "encoder='bogus': unknown encoder"),
    (["train", "encoder=timm:no_such_vit"], "encoder='timm:no_such_vit'"),
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
    (["run", "mask_ratio", "--smoke", "--workers-per-trial", "0"], "--workers-per-trial 0: workers_per_trial=0"),
    (["run", "mask_ratio", "--smoke", "--workers-per-trial", "3", "batch_size=8"],
     "batch_size=8 is not divisible by workers_per_trial=3"),
    (["run", "mask_ratio", "--smoke", "--workers-per-trial", "2", "--gpus-per-trial", "0.5"],
     "each worker of a trial needs a whole GPU"),
    (["run", "mask_ratio", "--smoke", "--gpus-per-trial", "1"], "--gpus-per-trial 1: each trial asks for 1 GPU(s) but this machine has 0"),
    (["run", "mask_ratio", "--smoke", "--cpus-per-trial", "4096"], "--cpus-per-trial 4096"),
    (["report", "mask_ratio"], "mask_ratio"),
    (["report", "no_such_study"], "no_such_study"),
    (["report", "../../etc"], "study name"),
    (["report", "mask_ratio", "--format", "gif"], "--format"),
    (["evaluate", "mask_ratio", "mask_ratio=0.5"], "evaluate changes only eval.* keys"),
    (["evaluate", "--run", "abc", "steps=5"], "steps needs a new pretraining"),
    (["evaluate"], "evaluate needs a STUDY or --run RUN_ID"),
    (["evaluate", "mask_ratio", "eval.knn_ks=5"], "no MLflow store"),
    (["bogus"], "invalid choice"),
    (["config", "mask_ration"], "unknown key 'mask_ration' (did you mean mask_ratio?)"),
    (["config", "mask_ratio", "eval.nope"], "unknown key 'eval.nope'"),
    (["train", "eval.features=cls"], "eval.features=cls reads the class token; set class_token=true"),
    (["run", "partial_finetune", "--smoke", "eval.features=cls"], "eval.features=cls reads the class token"),
    (["run", "mask_ratio", "--smoke", "eval.finetune_blocks=0,some"], "eval.finetune_blocks='some'"),
]


@pytest.mark.parametrize("args,words", BAD_INVOCATIONS, ids=[" ".join(a) for a, _ in BAD_INVOCATIONS])
def test_bad_input_is_one_line_and_exit_2(args, words, bad_files, tmp_path, monkeypatch, capsys):
    import ray

    own_ray()  # the suite's shared Ray, if an earlier test started it: this test checks none starts
    monkeypatch.chdir(tmp_path)
    if "steps=7" in args:  # an interrupted smoke study whose grid had the default steps
        from studies.named_studies import get_study
        from studies.runner import save_state
        from studies.study import cell_id

        cells = get_study("mask_ratio").smoke().cells()
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
    assert not (tmp_path / "mae_runs" / "mlflow.db").exists(), "nor in run's --out folder"
    assert not ray.is_initialized(), "Ray never started"


# --------------------------------------------------------------- config, version, usage, help

ROOT = Path(__file__).resolve().parents[1]


def every_key() -> list[str]:
    """Every key a user can type, from the models themselves (so a new field is checked too)."""
    top = [name for name in Config.model_fields if name != "eval"]
    return top + [f"eval.{name}" for name in EvalConfig.model_fields]


def test_config_prints_every_key_with_its_default_range_and_meaning(capsys):
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    for key in every_key():
        assert key in out, key
    assert main(["config", "mask_ratio", "eval.finetune_shots"]) == 0
    cells = [[cell.strip() for cell in line.split("│")[1:-1]]
             for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    rows = {row[0]: row for row in cells if row[0]}  # a wrapped description continues under an empty key
    assert list(rows) == ["mask_ratio", "eval.finetune_shots"]
    assert rows["mask_ratio"][1:3] == ["0.75", "number in (0, 1)"]
    assert rows["mask_ratio"][3].startswith("ρ; visible count k")
    assert rows["eval.finetune_shots"][1:3] == ["null", "integer ≥ 1 | null"]


def test_config_yaml_is_every_default_and_train_accepts_it_unchanged(tmp_path, capsys):
    assert main(["config", "--yaml"]) == 0
    text = capsys.readouterr().out
    keys = yaml.safe_load(text)
    assert set(keys) == set(Config.model_fields)
    assert set(keys["eval"]) == set(EvalConfig.model_fields)
    assert "# ρ; visible count k = int(M·(1-ρ)) [number in (0, 1)]\nmask_ratio: 0.75" in text
    path = tmp_path / "defaults.yaml"
    path.write_text(text)
    assert resolve_config(str(path), []) == Config()


def test_version_is_the_distributions(capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"mae-study {metadata.version('mae-study')}"

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert package_version() == declared


def test_no_arguments_prints_the_usage_and_exits_2(capsys):
    status, err = mae_study(capsys=capsys)
    assert status == 2
    assert "usage: mae-study" in err and "train" in err and "config" in err
    errors = [line for line in err.splitlines() if line.startswith("mae-study: error:")]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    assert "Traceback" not in err


HELP_PROBE = """
import contextlib, io, json, sys
from studies.cli import main
shown = {}
for argv in (["--help"], ["train", "--help"], ["--version"], ["config"], ["config", "--yaml"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
    shown[" ".join(argv)] = out.getvalue()
heavy = [name for name in ("torch", "ray", "mlflow", "numpy", "pandas") if name in sys.modules]
print(json.dumps({"heavy": heavy, "shown": shown}))
"""


def test_help_version_and_config_import_no_torch_ray_or_mlflow():
    done = subprocess.run([sys.executable, "-c", HELP_PROBE], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["heavy"] == [], "--help, --version and config must start without the heavy libraries"
    train_help = result["shown"]["train --help"]
    assert "--smoke" in train_help and "--json" in train_help and "mae-study config" in train_help
    assert all(key in train_help for key in every_key()), "train --help lists the config keys"
    assert "mae-study" in result["shown"]["--version"]
