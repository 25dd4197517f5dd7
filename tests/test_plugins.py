"""Plugins: the example in examples/plugin/ trains for real through the CLI; a plugin that
cannot be imported is one line and exit status 2; study files load theirs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from mae_core import plugins, registry
from studies.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plugin" / "patch_stats.py"
pytestmark = pytest.mark.usefixtures("fresh_plugins")  # conftest: only the built-ins, no plugin loaded


def cli(*argv: str) -> int:
    try:
        return main(list(argv))
    except SystemExit as exit_:
        return exit_.code


def keras_npz(path: Path, size: int = 16) -> Path:
    """A Keras-layout npz: 96 training and 32 test grey images of noise, two classes."""
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.integers(0, 256, (96, size, size), dtype=np.uint8), "y_train": np.arange(96) % 2,
              "x_test": rng.integers(0, 256, (32, size, size), dtype=np.uint8), "y_test": np.arange(32) % 2}
    np.savez(path, **arrays)
    return path


@pytest.mark.slow
def test_the_example_plugin_trains_a_dae_on_its_own_target_corruption_and_format(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    data = keras_npz(tmp_path / "noise.npz")
    status = cli("train", "--smoke", "--out", str(tmp_path), "--plugin", str(EXAMPLE),
                 f"dataset=keras_npz:{data}", "target=patch_stats", "objective=dae", "corruption=patch_dropout",
                 "encoder_width=16", "encoder_depth=1", "decoder_width=8", "decoder_depth=1", "batch_size=16",
                 "steps=10", "eval.evaluators=risks,probes,rankme")
    err = capsys.readouterr().err
    assert status == 0, err
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("mae-study").experiment_id])
    assert run.info.status == "FINISHED"
    params, metrics = run.data.params, run.data.metrics
    assert (params["target"], params["corruption"], params["patch_dim"]) == ("patch_stats", "patch_dropout", "16")
    assert params["dataset"] == f"keras_npz:{data}"
    for name in ("train_loss", "test_rec_risk", "test_den_risk", "probe_linear_acc", "test_baseline_risk"):
        assert np.isfinite(metrics[name]) and metrics[name] >= 0, name
    assert "reconstructions.png" in [a.path for a in client.list_artifacts(run.info.run_id)]
    # the plugin's evaluator: its metric logged, and a row of the table the reports read
    from evaluation.metrics import METRICS

    assert params["eval.evaluators"] == "('risks', 'probes', 'rankme')"
    assert 1.0 <= metrics["test_feature_rankme"] <= 16  # at most the encoder's width
    assert METRICS["test_feature_rankme"].label == "effective rank of the features (RankMe)"


def test_the_example_plugins_parts_behave_as_documented():
    import torch

    plugins.load_plugins([str(EXAMPLE)])
    patches = torch.rand(2, 4, 16)
    stats = registry.targets.get("patch_stats")
    assert stats.out_dim == 2 and stats.function(patches).shape == (2, 4, 2)
    assert stats.inverse(stats.function(patches), patches).shape == patches.shape
    dropped = registry.corruptions.get("patch_dropout").function(patches, 1.0, torch.Generator())
    assert not dropped.any()
    from mae_core import data

    assert registry.dataset_formats.get("keras_npz").function is not None and "keras_npz:PATH" in data.ALLOWED_FORMS


@pytest.mark.parametrize("source, says", [
    ("raise RuntimeError('no GPU here')", "failed to import: RuntimeError: no GPU here"),
    ("import a_module_that_is_not_there", "failed to import: ModuleNotFoundError"),
    ("from mae_core.registry import target\n@target('norm')\ndef mine(p):\n    return p\n",
     "target='norm' is registered twice"),
])
def test_a_plugin_that_fails_to_import_is_one_line_and_exit_status_2(tmp_path, capsys, source, says):
    plugin = tmp_path / "broken.py"
    plugin.write_text(source)
    for command in (["train", "--smoke"], ["run", "mask_ratio", "--smoke"], ["report", "mask_ratio"],
                    ["evaluate", "mask_ratio"]):
        assert cli(*command, "--out", str(tmp_path), "--plugin", str(plugin)) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and says in err and str(plugin) in err, err


def test_a_missing_module_or_file_is_one_line(tmp_path, capsys):
    assert cli("train", "--plugin", "no_such_plugin_module") == 2
    assert "plugin no_such_plugin_module: no such module" in capsys.readouterr().err
    assert cli("train", "--plugin", str(tmp_path / "absent.py")) == 2
    assert "absent.py: no such file" in capsys.readouterr().err


def test_a_plugin_is_loaded_once_and_exported_for_workers(monkeypatch):
    specs = plugins.load_plugins([str(EXAMPLE), str(EXAMPLE)])
    assert specs == [str(EXAMPLE)] * 2 and plugins.loaded_specs() == [str(EXAMPLE)]
    import os

    assert os.environ[plugins.ENVIRONMENT_VARIABLE] == str(EXAMPLE)
    monkeypatch.setattr(plugins, "_loaded", {})
    assert plugins.load_from_environment() == [str(EXAMPLE)]  # a worker's side: the same file again


def test_a_study_file_loads_its_plugins_before_checking_its_grid(tmp_path):
    from studies.study_files import StudyFileError, load_study_file

    data = keras_npz(tmp_path / "noise.npz")
    (tmp_path / "parts.py").write_text(EXAMPLE.read_text())
    study = tmp_path / "stats.yaml"
    study.write_text(f"plugins: [parts.py]\nbase: {{dataset: 'keras_npz:{data}', objective: dae}}\n"
                     "axes: {corruption: [gaussian, patch_dropout], target: [raw, patch_stats]}\nseeds: [0]\n")
    assert len(load_study_file(study).cells()) == 4
    (tmp_path / "bad.yaml").write_text("plugins: [missing.py]\naxes: {mask_ratio: [0.5]}\n")
    with pytest.raises(StudyFileError, match=r"bad.yaml: plugins: plugin .*missing.py: no such file"):
        load_study_file(tmp_path / "bad.yaml")


@pytest.mark.slow
def test_ray_trials_import_the_study_files_plugins(tmp_path, local_ray):
    """The trial processes are not the driver: they load the plugins the driver loaded."""
    from mlflow.tracking import MlflowClient

    from studies.runner import RunOptions, plan_study, run_study
    from studies.study_files import load_study_file

    data = keras_npz(tmp_path / "noise.npz")
    study = tmp_path / "stats.yaml"
    study.write_text(f"plugins: [{EXAMPLE}]\n"
                     f"base: {{dataset: 'keras_npz:{data}', objective: dae, corruption: patch_dropout, steps: 10,\n"
                     "       encoder_width: 16, encoder_depth: 1, decoder_width: 8, decoder_depth: 1, batch_size: 16}\n"
                     "axes: {target: [patch_stats]}\nseeds: [0]\n")
    plan = plan_study(load_study_file(study), smoke=True, overrides={})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    state = run_study(plan, RunOptions(out_dir=tmp_path / "out", tracking_uri=uri))
    assert state["errored"] == 0
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("mae-study").experiment_id],
                              f"tags.`mlflow.parentRunId` = '{state['parent_run_id']}'")
    assert [(run.info.status, run.data.params["target"]) for run in runs] == [("FINISHED", "patch_stats")]


def test_an_installed_packages_entry_point_is_loaded(tmp_path, monkeypatch):
    import importlib.metadata

    (tmp_path / "stats_package_plugin.py").write_text(EXAMPLE.read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    point = importlib.metadata.EntryPoint("stats", "stats_package_plugin", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [point] if group == plugins.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(plugins, "_entry_points", set())
    monkeypatch.delitem(sys.modules, "stats_package_plugin", raising=False)
    assert plugins.load_plugins([]) == [] and "patch_stats" in registry.targets.names()
    broken = importlib.metadata.EntryPoint("broken", "no_such_package_plugin", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [broken])
    with pytest.raises(plugins.PluginError, match=r"^plugin no_such_package_plugin \(entry point broken\) "
                                                  r"failed to import: ModuleNotFoundError"):
        plugins.load_plugins([])


def test_an_evaluator_runs_when_listed_and_a_metric_it_did_not_declare_fails_the_trial():
    from conftest import tiny_config
    from evaluation import UndeclaredMetric, evaluate_trial
    from evaluation.metrics import Metric
    from mae_core import build_model
    from mae_core.config import ConfigError
    from mae_core.data import prepare_data

    row = Metric("test_patch_count", "bookkeeping", "patches per image", "patches per image", "patches", False)

    @registry.evaluator("patch_count", metrics=[row])
    def patch_count(model, config, data, *, baselines=None):
        return {"test_patch_count": float(data.test_patches.shape[1])}

    @registry.evaluator("sloppy", metrics=[row])
    def sloppy(model, config, data, *, baselines=None):
        return {"test_patch_count": 1.0, "something_else": 2.0}

    config = tiny_config(**{"eval.evaluators": "risks,patch_count"})
    data = prepare_data(config)
    model = build_model(config).eval()
    metrics = evaluate_trial(model, config, data)
    assert metrics["test_patch_count"] == 16.0 and "test_mae_risk" in metrics and "probe_linear_acc" not in metrics
    with pytest.raises(UndeclaredMetric, match="something_else"):
        evaluate_trial(model, tiny_config(**{"eval.evaluators": "sloppy"}), data)
    with pytest.raises(ConfigError, match="eval.evaluators"):
        tiny_config(**{"eval.evaluators": "risks,nope"})
