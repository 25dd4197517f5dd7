"""Layer-wise probes (issue 25 part 7): ``eval.probe_blocks`` probes the features after encoder block b."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from evaluation.metrics import METRICS, block_metric, block_metric_names
from evaluation.probes import frozen_probes, probe_metrics, validation_split
from mae_core import Config, ConfigError, build_model, prepare_data
from mae_core.config import config_keys

QUICK_EVAL = {"eval.fewshot": 2, "eval.fewshot_draws": 1, "eval.linear_cs": "1", "eval.knn_ks": "5"}


@pytest.mark.parametrize("keys", [dict(), dict(class_token=True, **{"eval.features": "both"}),
                                  dict(objective="ae"), dict(mask_token_in_encoder=True)])
def test_features_after_every_block_are_the_final_features_bitwise(keys):
    config = tiny_config(encoder_depth=2, **keys)
    torch.manual_seed(0)
    model = build_model(config).eval()
    patches = torch.randn(5, config.num_patches, config.patch_dim)
    pool = config.eval.features
    with torch.no_grad():
        final = model.features(patches, pool=pool)
        assert torch.equal(model.features(patches, pool=pool, blocks=2), final)
        first = model.features(patches, pool=pool, blocks=1)
    assert first.shape == final.shape and not torch.equal(first, final)
    with pytest.raises(ValueError, match="blocks=3"):
        model.features(patches, blocks=3)


def test_block_probes_are_named_by_block_and_the_last_block_is_the_final_probe():
    config = tiny_config(encoder_depth=2, **QUICK_EVAL, **{"eval.probe_blocks": [1, 2]})
    data = prepare_data(config)
    torch.manual_seed(0)
    model = build_model(config)
    metrics = probe_metrics(model, config, data)
    for probe in ("linear", "knn", "fewshot"):
        assert f"probe_{probe}_acc_block1" in metrics
        assert metrics[f"probe_{probe}_acc_block2"] == metrics[f"probe_{probe}_acc"]
    assert not any(name.startswith(("random_", "pixel_")) and "_block" in name for name in metrics)
    # the reused block-2 numbers are what probing after 2 blocks computes
    split = validation_split(data.train_labels.numpy(), config.eval.val_fraction, config.seed)
    again = frozen_probes(model, data, split, config.eval, seed=config.seed, blocks=2)
    assert again == {k: v for k, v in metrics.items() if k.endswith("_block2")}


@pytest.mark.parametrize("value", ["[0]", [3], "[1,3]", "two", True, 1.5])
def test_a_bad_probe_blocks_value_is_one_line_naming_the_key(value):
    with pytest.raises(ConfigError) as error:
        tiny_config(encoder_depth=2, **{"eval.probe_blocks": value})
    message = str(error.value)
    assert "eval.probe_blocks" in message and "\n" not in message


@pytest.mark.parametrize("value, parsed", [(None, ()), ("[]", ()), ("[4, 2]", (2, 4)), ("2,4", (2, 4)),
                                           (3, (3,)), ([2, 2, 4], (2, 4))])
def test_probe_blocks_values(value, parsed):
    assert Config(encoder_depth=4, **{"eval.probe_blocks": value}).eval.probe_blocks == parsed
    assert Config().eval.probe_blocks == ()


def test_probe_blocks_is_a_listed_key():
    (key,) = [k for k in config_keys() if k.name == "eval.probe_blocks"]
    assert key.default == () and "encoder_depth" in key.description and "final norm" in key.description


def test_block_metric_names_are_rows_of_the_metric_table():
    row = METRICS["probe_linear_acc_block2"]
    base = METRICS["probe_linear_acc"]
    assert "after block 2" in row.label and row.name == "probe_linear_acc_block2"
    assert (row.kind, row.unit, row.lower_is_better, row.delta, row.reference) == (
        base.kind, base.unit, base.lower_is_better, base.delta, base.reference)
    assert "probe_knn_k_block1" in METRICS and METRICS.get("probe_fewshot_acc_block10").kind == "downstream"
    for name in ("probe_linear_acc_block0", "random_probe_linear_acc_block1", "probe_nothing_block1", "x"):
        assert name not in METRICS and METRICS.get(name) is None and block_metric(name) is None
    with pytest.raises(KeyError):
        METRICS["probe_linear_acc_block0"]
    assert "probe_linear_acc_block2" not in list(METRICS)  # iteration: the fixed rows only
    columns = ["probe_knn_acc_block2", "seed", "probe_linear_acc_block10", "probe_linear_acc_block2", "probe_linear_acc"]
    assert block_metric_names(columns) == ["probe_linear_acc_block2", "probe_linear_acc_block10",
                                           "probe_knn_acc_block2"]
