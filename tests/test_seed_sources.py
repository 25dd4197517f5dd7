"""The noise split by source (issue 35 part 6-7): ``seed_data``, ``seed_init``, ``seed_masks`` and
``seed_eval`` each default to ``seed`` (the numbers every committed result was made with: the
pinned metrics of tests/test_probes.py hold unchanged), and changing one changes only what it
names; ``eval.repeats`` K averages K evaluations seeded seed_eval, seed_eval+1, ..."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_config
from evaluation import evaluate_trial
from evaluation.metrics import METRICS
from mae_core.config import Config, ConfigError
from mae_core.models import build_model
from mae_core.checkpoint import changed_keys
from mae_core.data import prepare_data
from mae_core.train import train
from studies.pretrained import pretraining_config

SOURCES = ("seed_data", "seed_init", "seed_masks", "seed_eval")
# Probes on a few images with one C, one k and two few-shot draws: seconds, and seed_eval's
# draws (validation split, few-shot examples) still move the numbers.
QUICK_EVAL = {"eval.linear_cs": "1", "eval.knn_ks": "5", "eval.fewshot_draws": 2, "eval.fewshot": 2}


def config(**keys) -> Config:
    return tiny_config(seed=2, train_limit=120, test_limit=40, **QUICK_EVAL, **keys)


def trained(cfg: Config):
    """(data, the model at initialisation, the trained result) of one tiny run."""
    data = prepare_data(cfg)
    torch.manual_seed(cfg.init_seed)  # train() initialises the same way
    initial = build_model(cfg).state_dict()
    return data, initial, train(cfg, data)


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def same_split(a, b) -> bool:
    return all(torch.equal(getattr(a, name), getattr(b, name))
               for name in ("train_patches", "train_labels", "test_patches", "test_labels"))


@pytest.fixture(scope="module")
def default_run():
    cfg = config()
    data, initial, result = trained(cfg)
    return cfg, data, initial, result, evaluate_trial(result.model, cfg, data)


def test_each_source_defaults_to_the_seed_and_is_logged_resolved():
    cfg = Config(seed=4, seed_masks=9)
    assert (cfg.data_seed, cfg.init_seed, cfg.masks_seed, cfg.eval_seed) == (4, 4, 9, 4)
    resolved = cfg.resolved()  # what a trial logs as its params
    assert {key: resolved[key] for key in SOURCES} == {"seed_data": 4, "seed_init": 4, "seed_masks": 9,
                                                       "seed_eval": 4}
    with pytest.raises(ConfigError, match="seed_init"):
        Config(seed_init=-1)


def test_seeds_left_at_none_equal_the_seed_given_explicitly(default_run):
    """None means ``seed``: the same split, initial and trained weights, loss and metrics, bit for bit."""
    cfg, data, initial, result, metrics = default_run
    explicit = config(**{key: 2 for key in SOURCES})
    data2, initial2, result2 = trained(explicit)
    assert same_split(data, data2) and same_weights(initial, initial2)
    assert same_weights(result.model.state_dict(), result2.model.state_dict())
    assert result.history == result2.history
    assert evaluate_trial(result2.model, explicit, data2) == metrics
    # and one pretraining (studies.pretrained) serves both: the key is the one it was before
    assert pretraining_config(explicit) == pretraining_config(cfg)
    assert not any(key in pretraining_config(cfg) for key in SOURCES)


def test_seed_eval_leaves_the_training_alone_and_moves_the_evaluation(default_run):
    cfg, data, initial, result, metrics = default_run
    other = config(seed_eval=7)
    data2, initial2, result2 = trained(other)
    assert same_split(data, data2) and same_weights(initial, initial2)
    assert same_weights(result.model.state_dict(), result2.model.state_dict())
    moved = evaluate_trial(result2.model, other, data2)
    assert moved.keys() == metrics.keys() and moved != metrics
    # the risks are exact here (C(16,4) masks enumerated): no evaluation draw reaches them
    assert moved["test_mae_risk"] == metrics["test_mae_risk"]
    # trials differing in seed_eval only share one pretraining
    assert pretraining_config(other) == pretraining_config(cfg)


def test_seed_init_changes_the_initial_weights_but_not_the_split(default_run):
    cfg, data, initial, result, _ = default_run
    data2, initial2, result2 = trained(config(seed_init=5))
    assert same_split(data, data2)
    assert not same_weights(initial, initial2)
    assert pretraining_config(config(seed_init=5)) != pretraining_config(cfg)


def test_seed_masks_changes_the_training_draws_only(default_run):
    cfg, data, initial, result, _ = default_run
    data2, initial2, result2 = trained(config(seed_masks=5))
    assert same_split(data, data2) and same_weights(initial, initial2)
    assert result.history != result2.history
    assert not same_weights(result.model.state_dict(), result2.model.state_dict())


def test_seed_data_changes_the_split_only(default_run):
    cfg, data, initial, result, _ = default_run
    data2, initial2, _ = trained(config(seed_data=5))
    assert not same_split(data, data2)
    assert same_weights(initial, initial2)


def test_a_checkpoint_written_before_the_seed_keys_still_resumes():
    cfg = Config(seed=3)
    saved = {key: value for key, value in cfg.resolved().items() if key not in SOURCES and key != "eval.repeats"}
    assert changed_keys(cfg, saved) == []
    assert changed_keys(Config(seed=3, seed_init=3), saved) == []
    assert changed_keys(Config(seed=3, seed_masks=4), saved) == ["seed_masks"]


def test_eval_repeats_logs_the_mean_of_the_evaluations_of_consecutive_seeds(default_run):
    cfg, data, _, result, first = default_run
    second = evaluate_trial(result.model, cfg.with_updates(seed_eval=cfg.eval_seed + 1), data)
    repeated = evaluate_trial(result.model, cfg.with_updates(**{"eval.repeats": 2}), data)
    data_bookkeeping = {"data_train_test_duplicates"}  # logged once beside the evaluators, never repeated
    evaluated = set(first) - data_bookkeeping
    assert set(repeated) == set(first) | {f"{name}_sd" for name in evaluated}
    for name in evaluated:
        assert repeated[name] == pytest.approx((first[name] + second[name]) / 2, abs=1e-12)
        assert repeated[f"{name}_sd"] == pytest.approx(np.std([first[name], second[name]], ddof=1), abs=1e-12)
    assert repeated["data_train_test_duplicates"] == first["data_train_test_duplicates"]
    assert any(repeated[f"{name}_sd"] > 0 for name in evaluated)  # the evaluations did differ
    row = METRICS["probe_linear_acc_sd"]  # every logged name is a row of the metric table
    assert row.kind == "bookkeeping" and row.unit == METRICS["probe_linear_acc"].unit
    assert "eval.repeats" not in pretraining_config(cfg.with_updates(**{"eval.repeats": 2}))
