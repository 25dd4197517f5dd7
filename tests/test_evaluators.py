"""Evaluators as classes (mae_core.evaluator, evaluation.evaluators, evaluation.features):
typed eval.<name>.<key> settings, a plugin probe with its baselines in one file, features
extracted once per trial, and the online evaluator run through the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from conftest import tiny_config
from mae_core import plugins, registry
from mae_core.config import Config, ConfigError
from mae_core.evaluator import PIXELS, RANDOM_INIT, Evaluator, register_evaluator

ROOT = Path(__file__).resolve().parents[1]
CENTROID = ROOT / "examples" / "plugin" / "centroid_probe.py"
pytestmark = pytest.mark.usefixtures("fresh_plugins")  # conftest: only the built-ins, no plugin loaded


def _trained(config):
    from mae_core.data import prepare_data
    from mae_core.train import train

    data = prepare_data(config)
    return train(config, data).model.eval(), data


def test_the_builtins_are_registered_as_classes_with_their_settings():
    for name in ("risks", "probes", "online"):
        entry = registry.evaluators.get(name)
        assert issubclass(entry.evaluator_class, Evaluator) and entry.settings is entry.evaluator_class.Settings
    assert registry.evaluators.get("online").during_training
    assert registry.evaluators.get("probes").evaluator_class.baselines["pixel_probe_"] == PIXELS
    assert not registry.evaluators.get("risks").evaluator_class.needs_labels


def test_eval_name_key_is_an_alias_of_a_builtins_eval_key():
    assert Config(**{"eval.probes.fewshot": 4}) == Config(**{"eval.fewshot": 4})
    assert Config(**{"eval": {"probes": {"knn_ks": "1,5"}}}).eval.knn_ks == (1, 5)
    assert Config(**{"eval.online.every": 3}).eval.every == 3
    # an alias logs the same params as the key it names: nothing new in a stored run
    assert Config(**{"eval.probes.fewshot": 4}).resolved() == Config(**{"eval.fewshot": 4}).resolved()
    with pytest.raises(ConfigError, match="one key"):
        Config(**{"eval.probes.fewshot": 4, "eval.fewshot": 5})


@pytest.mark.parametrize("keys, message", [
    ({"eval.centroid.distance": "manhattan"}, r"^eval\.centroid\.distance='manhattan': Input should be"),
    ({"eval.centroid.nope": 1}, r"^unknown key eval\.centroid\.nope; its keys: eval\.centroid\.distance"),
    ({"eval.nothing.key": 1}, r"^unknown key 'eval\.nothing\.key'"),
    ({"eval.risks.key": 1}, r"^unknown key eval\.risks\.key; its keys: none"),
    ({"eval.probes.fewshot": 0}, r"^eval\.fewshot=0: Input should be greater than or equal to 1"),  # one key
])
def test_a_wrong_evaluator_key_or_value_is_one_line(keys, message):
    plugins.load_plugins([str(CENTROID)])
    with pytest.raises(ConfigError, match=message) as error:
        Config(**keys)
    assert "\n" not in str(error.value)


def test_a_plugins_settings_are_typed_logged_and_survive_a_copy():
    plugins.load_plugins([str(CENTROID)])
    config = Config(**{"eval.evaluators": "risks,centroid", "eval.centroid.standardize": "true"})
    evaluator = registry.evaluators.get("centroid").evaluator_class.from_config(config)
    assert evaluator.settings.standardize is True and evaluator.settings.distance == "euclidean"
    assert config.resolved()["eval.centroid.standardize"] == "true"  # as given: the param a run logs
    assert config.with_updates(seed_eval=3).eval.evaluator_settings() == config.eval.evaluator_settings()
    assert "eval.centroid.distance" in {key.name for key in __import__("mae_core.config").config.config_keys()}


def test_a_bad_evaluator_key_exits_2_before_any_run(tmp_path, capsys):
    from studies.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["train", "--out", str(tmp_path), "--plugin", str(CENTROID), "eval.centroid.distance=far"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "eval.centroid.distance" in err[0], err
    assert not (tmp_path / "mlflow.db").exists()


def test_the_plugin_probe_logs_its_metric_and_both_baselines_from_one_extraction(monkeypatch):
    from evaluation import evaluate_trial, features as features_module
    from evaluation.metrics import METRICS

    plugins.load_plugins([str(CENTROID)])
    config = tiny_config(**{"eval.evaluators": "risks,probes,centroid", "eval.linear_cs": "1.0",
                            "eval.knn_ks": "5", "eval.fewshot_draws": 1})
    model, data = _trained(config)
    made = []
    real = features_module.TrialFeatures

    class Counted(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(features_module, "TrialFeatures", Counted)
    metrics = evaluate_trial(model, config, data)
    for name in ("centroid_acc", "random_centroid_acc", "pixel_centroid_acc"):
        assert 0.0 <= metrics[name] <= 1.0, name
    (features,) = made
    # the trained and the random-init encoders, each read once for the probes and the plugin
    assert features.extractions == 2
    # the baselines are rows of the table, set beside the plugin's row as the built-ins' are
    assert METRICS["centroid_acc"].reference == "random_centroid_acc"
    assert METRICS["centroid_acc"].baselines == ("pixel_centroid_acc",)
    assert METRICS["random_centroid_acc"].kind == METRICS["pixel_centroid_acc"].kind == "reference"
    assert METRICS["pixel_centroid_acc"].label.endswith("(raw pixels)")


def test_the_shared_features_change_no_probe_number():
    from evaluation.probes import probe_metrics
    from evaluation.features import TrialFeatures

    config = tiny_config(**{"eval.linear_cs": "1.0", "eval.knn_ks": "5", "eval.fewshot_draws": 1,
                            "eval.probe_blocks": "1"})
    model, data = _trained(config)
    alone = probe_metrics(model, config, data)
    shared = probe_metrics(model, config, data, features=TrialFeatures(model, config, data))
    assert shared == alone


def test_the_plugin_baselines_are_kept_in_the_studys_cache(tmp_path):
    from evaluation import evaluate_trial
    from evaluation.baselines import BaselineCache

    plugins.load_plugins([str(CENTROID)])
    config = tiny_config(**{"eval.evaluators": "centroid"})
    model, data = _trained(config)
    first, second = BaselineCache(tmp_path), BaselineCache(tmp_path)
    computed = evaluate_trial(model, config, data, baselines=first)
    reused = evaluate_trial(model, config, data, baselines=second)
    assert [outcome for _, outcome in first.outcomes] == ["computed", "computed"]
    assert [outcome for _, outcome in second.outcomes] == ["reused", "reused"]
    assert reused == computed


def test_a_class_evaluator_in_a_test_registers_and_measures():
    from evaluation import evaluate_trial
    from evaluation.metrics import Metric

    class Width(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        scale: float = Field(1.0, gt=0)

    @register_evaluator
    class PatchCount(Evaluator):
        name = "patch_count"
        Settings = Width
        metrics = (Metric("test_patch_count", "bookkeeping", "patches", "patches", "patches", False),)
        needs_labels = False

        def measure(self, trial):
            return {"test_patch_count": self.settings.scale * trial.data.test_patches.shape[1]}

    config = tiny_config(**{"eval.evaluators": "patch_count", "eval.patch_count.scale": 2})
    model, data = _trained(config)
    assert evaluate_trial(model, config, data)["test_patch_count"] == 32.0
    with pytest.raises(Exception, match="baselines are measured as one of"):
        register_evaluator(type("Odd", (Evaluator,), {"name": "odd", "baselines": {"x_": "elsewhere"}}))
    assert RANDOM_INIT in registry.evaluators.get("probes").evaluator_class.baselines.values()


def test_the_online_evaluator_runs_through_the_registry(tmp_path):
    from mlflow.tracking import MlflowClient

    from evaluation.online import METRIC_NAMES
    from studies.trial import _online_evaluation, during_training

    config = tiny_config(steps=2, **{"eval.online.every": 2, "eval.online_images": 8})
    assert [type(e).__name__ for e in during_training(config)] == ["Online"]
    assert during_training(tiny_config()) == []  # eval.every=0: off
    model, data = _trained(config)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    seen = []

    @register_evaluator
    class Spy(Evaluator):  # a second during-training evaluator: the trial runs it too
        name = "spy"
        during_training = True
        metrics = registry.evaluators.get("online").metrics[:1]

        def during(self, config, data):
            return lambda model: seen.append(model) or {}

    _online_evaluation(client, run_id, config, data)(2, model)
    assert seen == [model]
    assert {m.step for m in client.get_metric_history(run_id, METRIC_NAMES[0])} == {2}


def test_smoke_settings_and_baseline_prefixes_come_from_the_registry():
    from evaluation.baselines import baseline_prefixes, is_baseline_metric
    from studies.study import smoke_eval

    # the numbers every smoke study had: the probes' one candidate per choice, one few-shot draw
    assert smoke_eval() == {"eval.linear_cs": "1.0", "eval.knn_ks": "5", "eval.fewshot_draws": 1}
    assert baseline_prefixes() == ("random_probe_", "pixel_probe_", "random_finetune_", "scratch_best_finetune_")
    plugins.load_plugins([str(CENTROID)])
    assert is_baseline_metric("pixel_centroid_acc") and not is_baseline_metric("centroid_acc")


PROBE_PARTS = ("frozen_probes", "layer_probes", "finetune")


def test_the_probes_are_three_registered_evaluators_with_their_own_settings_and_baselines():
    from evaluation import probe_evaluators
    from mae_core.evaluator import expand

    classes = {name: registry.evaluators.get(name).evaluator_class for name in PROBE_PARTS}
    assert tuple(classes.values()) == probe_evaluators.PARTS
    assert all(issubclass(cls, Evaluator) for cls in classes.values())
    assert classes["frozen_probes"].baselines == {"random_probe_": RANDOM_INIT, "pixel_probe_": PIXELS}
    assert set(classes["finetune"].baselines.values()) == {RANDOM_INIT} and not classes["layer_probes"].baselines
    assert "linear_cs" in classes["frozen_probes"].Settings.model_fields
    assert "finetune_steps" in classes["finetune"].Settings.model_fields
    assert "finetune_steps" not in classes["frozen_probes"].Settings.model_fields
    assert "probe_blocks" in classes["layer_probes"].Settings.model_fields
    # each owns its rows of the metric table; the alias holds all of them, in the same order
    assert "probe_linear_acc" in {row.name for row in classes["frozen_probes"].metrics}
    assert "scratch_best_finetune_acc" in {row.name for row in classes["finetune"].metrics}
    assert classes["layer_probes"].declares("probe_knn_acc_block2") and not classes["finetune"].declares("probe_knn_acc")
    probes = registry.evaluators.get("probes").evaluator_class
    assert probes.parts == PROBE_PARTS and expand(("risks", "probes")) == ("risks", *PROBE_PARTS)
    assert [row.name for row in probes.metrics] == [row.name for name in PROBE_PARTS for row in classes[name].metrics]
    # a key of one of them is the same key under its name, the alias's and eval.<key>
    assert (Config(**{"eval.finetune.finetune_steps": 3}) == Config(**{"eval.probes.finetune_steps": 3})
            == Config(**{"eval.finetune_steps": 3}))
    with pytest.raises(ConfigError, match="twice"):
        Config(**{"eval.evaluators": "risks,probes,finetune"})


def test_naming_the_three_logs_what_probes_logs(tmp_path):
    from evaluation import evaluate_trial
    from evaluation.baselines import BaselineCache
    from evaluation.probes import probe_metrics

    keys = {"eval.linear_cs": "1.0", "eval.knn_ks": "5", "eval.fewshot_draws": 1, "eval.probe_blocks": "1",
            "eval.finetune_steps": 2, "eval.finetune_blocks": 1, "eval.scratch_max_steps": 4}
    alias = tiny_config(**keys)
    named = tiny_config(**keys, **{"eval.evaluators": "risks," + ",".join(PROBE_PARTS)})
    model, data = _trained(alias)
    expected = evaluate_trial(model, alias, data)
    assert evaluate_trial(model, named, data) == expected
    assert {k: v for k, v in expected.items() if k in probe_metrics(model, alias, data)} == probe_metrics(model, alias, data)
    assert "probe_linear_acc_block1" in expected and "scratch_best_finetune_acc" in expected
    # each keeps its baselines in the study's cache: frozen probes' and from-scratch fine-tuning's
    cache = BaselineCache(tmp_path)
    assert evaluate_trial(model, named, data, baselines=cache) == expected
    assert evaluate_trial(model, named, data, baselines=cache) == expected  # read back: the same numbers
    assert [how for _, how in cache.outcomes] == ["computed", "computed", "reused", "reused"]


@pytest.mark.slow  # a fresh interpreter per module (test-fast leaves subprocesses out)
@pytest.mark.parametrize("first", ["evaluation.metrics", "evaluation.evaluators", "mae_core.config"])
def test_any_module_may_be_imported_first(first):
    """The evaluator registry fills from evaluation.evaluators, whose settings views import
    mae_core.config: a config validated while that import is under way would see no evaluators
    (``risks, probes not one of``). Whichever module a program imports first, the metric rows and
    a default Config are there."""
    import subprocess
    import sys

    program = (f"import {first}\n"
               "from evaluation.metrics import all_rows\n"
               "from mae_core.config import Config\n"
               "assert 'probe_linear_acc' in {row.name for row in all_rows()}\n"
               "assert Config().eval.evaluators == ('risks', 'probes')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
