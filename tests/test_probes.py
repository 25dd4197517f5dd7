"""Probes: the pure scikit-learn probes on synthetic features, then the full call on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evaluation.probes import (
    fewshot_accuracy,
    fewshot_indices,
    finetune_accuracy,
    knn_accuracy,
    linear_probe_accuracy,
    probe_metrics,
    random_init_model,
)
from mae_core import Config, build_model, prepare_data

FROZEN_KEYS = {"probe_linear_acc", "probe_fewshot_acc", "probe_knn_acc", "random_probe_linear_acc",
               "random_probe_fewshot_acc", "random_probe_knn_acc"}


def _blobs(n: int, separation: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two Gaussian blobs ``[n,8]`` centred at ``±separation/2`` on every axis (apart in angle
    too, as the cosine kNN needs)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    return rng.normal(size=(n, 8)) + separation * (y[:, None] - 0.5), y


@pytest.mark.parametrize("probe", [linear_probe_accuracy, knn_accuracy])
def test_separable_features_probe_near_one(probe):
    train_x, train_y = _blobs(400, 10.0, seed=0)
    test_x, test_y = _blobs(200, 10.0, seed=1)
    assert probe(train_x, train_y, test_x, test_y) > 0.99


@pytest.mark.parametrize("probe", [linear_probe_accuracy, knn_accuracy])
def test_shuffled_labels_probe_near_chance(probe):
    # Both splits' labels shuffled, so no label carries information about its features.
    # (Shuffling only the training labels is not chance: the probe would still split the two
    # blobs and score 0, 0.5 or 1 depending on which label each blob happens to get.)
    train_x, train_y = _blobs(600, 10.0, seed=0)
    test_x, test_y = _blobs(400, 10.0, seed=1)
    rng = np.random.default_rng(2)
    accuracy = probe(train_x, rng.permutation(train_y), test_x, rng.permutation(test_y))
    assert abs(accuracy - 0.5) < 0.1


def test_fewshot_uses_few_labels_and_is_seeded():
    train_x, train_y = _blobs(400, 4.0, seed=0)
    test_x, test_y = _blobs(200, 4.0, seed=1)
    first = fewshot_accuracy(train_x, train_y, test_x, test_y, shots=4, seed=3)
    assert first == fewshot_accuracy(train_x, train_y, test_x, test_y, shots=4, seed=3)
    assert 0.8 < first <= 1.0


def test_single_class_training_set_predicts_that_class():
    x = np.zeros((4, 3))
    assert linear_probe_accuracy(x, np.ones(4, int), x, np.array([1, 1, 0, 0])) == 0.5


# -------------------------------------------------------------------- on a tiny model

@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy machine two spin-waiting
    threads turn a 0.1 s fine-tune into seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TINY = dict(dataset="digits", encoder_width=16, encoder_depth=1, encoder_heads=2, decoder_width=8,
            decoder_depth=1, decoder_heads=2, train_limit=200, test_limit=100, device="cpu")


@pytest.fixture(scope="module")
def tiny():
    config = Config(**TINY)
    torch.manual_seed(1)
    return build_model(config), config, prepare_data(config)


def test_probe_metrics_keys_and_ranges(tiny):
    model, config, data = tiny
    model.train()
    metrics = probe_metrics(model, config, data)
    assert FROZEN_KEYS <= set(metrics)
    assert not {"finetune_acc", "partial_finetune_acc"} & set(metrics)
    assert all(0.0 <= metrics[k] <= 1.0 for k in FROZEN_KEYS)
    assert (metrics["probe_train_size"], metrics["probe_test_size"]) == (200.0, 100.0)
    assert model.training  # the caller's mode is restored


def test_random_reference_is_the_seeded_initial_model(tiny):
    _, config, data = tiny
    fresh = random_init_model(config)
    torch.manual_seed(config.seed)
    again = build_model(config)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), again.state_dict().values()))
    # so probing the initial model itself reproduces the random_* row exactly
    metrics = probe_metrics(fresh, config, data)
    for name in ("linear", "fewshot", "knn"):
        assert metrics[f"probe_{name}_acc"] == metrics[f"random_probe_{name}_acc"]


def test_finetune_adds_accuracy_and_leaves_the_model_alone(tiny):
    model, config, data = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = probe_metrics(model, config, data, finetune_steps=20, finetune_blocks=1)
    for key in ("finetune_acc", "random_finetune_acc", "partial_finetune_acc"):
        assert 0.0 <= metrics[key] <= 1.0
    assert "partial_finetune_blocks" not in metrics, "n is the eval.finetune_blocks param, not a metric"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_partial_finetune_updates_only_the_last_blocks(tiny, monkeypatch):
    model, config, data = tiny
    seen = {}
    original = torch.optim.AdamW

    def recording(params, **kwargs):
        params = list(params)
        seen["count"] = sum(p.numel() for p in params)
        return original(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", recording)
    finetune_accuracy(model, data, 1, seed=0, blocks=0)
    head_only = seen["count"]
    finetune_accuracy(model, data, 1, seed=0, blocks=1)
    transformer = model.encoder.transformer
    last = sum(p.numel() for p in transformer.blocks[-1].parameters()) + \
        sum(p.numel() for p in transformer.norm.parameters())
    assert seen["count"] == head_only + last
    with pytest.raises(ValueError, match="finetune_blocks"):
        finetune_accuracy(model, data, 1, seed=0, blocks=5)
    with pytest.raises(ValueError, match="finetune_steps"):
        probe_metrics(model, config, data, finetune_blocks=1)


def test_fewshot_finetune_sees_only_its_labelled_examples(tiny):
    """Fine-tuning on ``shots`` per class equals fine-tuning on a train split holding only them."""
    import dataclasses

    model, config, data = tiny
    chosen = torch.from_numpy(fewshot_indices(data.train_labels.numpy(), 2, seed=3))
    assert len(chosen) == 2 * len(torch.unique(data.train_labels))
    assert all(int((data.train_labels[chosen] == c).sum()) == 2 for c in torch.unique(data.train_labels))
    only_those = dataclasses.replace(data, train_patches=data.train_patches[chosen],
                                     train_labels=data.train_labels[chosen])
    assert finetune_accuracy(model, data, 5, seed=3, shots=2) == finetune_accuracy(model, only_those, 5, seed=3)
    metrics = probe_metrics(model, config, data, finetune_steps=5, finetune_shots=2)
    assert "finetune_shots" not in metrics, "n is the eval.finetune_shots param, not a metric"
