"""Online evaluation (``eval.every``): histories at step = update, a trajectory it never changes,
no step logged twice on resume, and what refuses it."""

from __future__ import annotations

import math

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import tiny_config
from evaluation.online import OnlineEvaluation
from mae_core.config import Config
from mae_core.data import prepare_data
from mae_core.train import train
from studies import pretrained
from studies.cli import main
from studies.reevaluate import EvaluateError, eval_overrides
from studies.trial import _online_evaluation

TINY = ["dataset=digits", "train_limit=64", "test_limit=32", "encoder_width=16", "encoder_depth=1",
        "decoder_width=8", "decoder_depth=1", "steps=20", "checkpoint_every=10", "log_every=5",
        "risk_exact_budget=2000"]


@pytest.mark.slow  # a real training run with its final evaluation
def test_eval_every_writes_a_history_of_more_than_one_point(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY, "eval.every=5", "eval.online_images=16"]) == 0, capsys.readouterr().err
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("mae-study").experiment_id])
    for key in ("online_knn_acc", "online_mae_risk"):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == [5, 10, 15, 20], key  # every 5 updates, the last included
        assert all(math.isfinite(m.value) and m.value >= 0 for m in history)
    assert all(0 <= m.value <= 1 for m in client.get_metric_history(run.info.run_id, "online_knn_acc"))
    assert run.data.params["eval.every"] == "5"
    from evaluation.metrics import METRICS  # every metric a trial logs is a row of the table

    assert [name for name in run.data.metrics if name not in METRICS and not name.startswith("system/")] == []


@pytest.mark.parametrize("objective", ["mae", "ae"])
def test_online_evaluation_leaves_the_losses_bitwise_unchanged(objective):
    """The same run with eval.every=0 and with eval.every=2 (the callback measuring after updates
    2, 4, 6, 7): identical losses and weights, bitwise; the callback leaves the model training
    and torch's global RNG where it was."""
    off = tiny_config(steps=7, objective=objective)
    on = tiny_config(steps=7, objective=objective, **{"eval": {"every": 2, "online_images": 8}})
    data = prepare_data(off)
    plain = train(off, data)
    online = OnlineEvaluation(on, data)
    seen = []

    def on_evaluate(step: int, model) -> None:
        rng = torch.random.get_rng_state()
        assert model.training
        seen.append((step, online(model)))
        assert model.training and all(m.training for m in model.modules())
        assert torch.equal(torch.random.get_rng_state(), rng)

    measured = train(on, data, on_evaluate=on_evaluate)
    assert [step for step, _ in seen] == [2, 4, 6, 7]
    assert set(seen[0][1]) == ({"online_knn_acc", "online_mae_risk"} if objective == "mae" else {"online_knn_acc"})
    assert measured.history == plain.history  # floats compared exactly
    trained = plain.model.state_dict()
    assert all(torch.equal(value, trained[key]) for key, value in measured.model.state_dict().items())
    assert train(off, data, on_evaluate=on_evaluate).history == plain.history  # every=0: never called
    assert len(seen) == 4


def test_the_same_model_measures_the_same_twice():
    """Fixed subsets and masks: two calls on one model agree, so a curve's steps compare like with like."""
    config = tiny_config(steps=2, **{"eval": {"every": 1, "online_images": 8}})
    data = prepare_data(config)
    model = train(config, data).model
    online = OnlineEvaluation(config, data)
    assert online(model) == online(model)


def test_a_resumed_run_never_logs_an_online_step_twice(tmp_path):
    config = tiny_config(steps=4, **{"eval": {"every": 2, "online_images": 8}})
    data = prepare_data(config)
    model = train(config, data).model
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    _online_evaluation(client, run_id, config, data)(2, model)
    resumed = _online_evaluation(client, run_id, config, data)  # a new process: reads what is logged
    resumed(2, model)
    resumed(4, model)
    assert [m.step for m in client.get_metric_history(run_id, "online_knn_acc")] == [2, 4]
    assert _online_evaluation(client, run_id, tiny_config(), data) is None  # eval.every=0: no callback


def test_online_settings_without_eval_every_are_refused():
    with pytest.raises(ValueError, match="eval.online_images=64 needs eval.every > 0"):
        Config(**{"eval.online_images": 64})
    assert Config(**{"eval.every": 10, "eval.online_images": 64}).eval.online_images == 64


def test_evaluate_refuses_the_keys_read_during_training():
    with pytest.raises(EvaluateError, match="eval.every is measured while the encoder trains"):
        eval_overrides(["eval.every=10"])


def test_online_keys_join_the_pretraining_key_only_when_on():
    """Cells that differ only in eval.* keys share an encoder; with eval.every > 0 the online
    histories a reusing trial copies must be its own, so the keys they read are in the key."""
    off = pretrained.pretraining_config(tiny_config(**{"eval": {"fewshot": 2}}))
    assert not any(key.startswith("eval.") for key in off)
    on = pretrained.pretraining_config(tiny_config(**{"eval": {"every": 5, "fewshot": 2}}))
    assert {key for key in on if key.startswith("eval.")} == {
        "eval.every", "eval.online_images", "eval.features", "eval.val_fraction"}
    other_probe = pretrained.pretraining_config(tiny_config(**{"eval": {"every": 5, "fewshot": 4}}))
    assert on == other_probe


def test_a_reusing_trial_carries_the_computing_trials_online_histories(tmp_path):
    from studies.trial import run_trial

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    cache = pretrained.PretrainedCache(tmp_path / "pretrained")
    online = {"eval.every": 2, "eval.online_images": 8}
    first = tiny_config(steps=4, checkpoint_every=2, **online, **{"eval.fewshot": 2})
    second = tiny_config(steps=4, checkpoint_every=2, **online, **{"eval.fewshot": 4})
    runs = [run_trial(config, prepare_data(config), tracking_uri=uri, checkpoint_path=tmp_path / name / "c.pt",
                      pretrained=cache, probes=False).run_id for config, name in ((first, "a"), (second, "b"))]
    assert client.get_run(runs[1]).data.tags["pretraining"].startswith("reused ")
    for key in ("online_knn_acc", "online_mae_risk"):
        histories = [sorted((m.step, m.value) for m in client.get_metric_history(run, key)) for run in runs]
        assert histories[0] == histories[1] and [step for step, _ in histories[0]] == [2, 4]
