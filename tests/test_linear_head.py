"""MAE's linear-probe head (BatchNorm without affine, then linear, trained by SGD)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from device_checks import DEVICE, HostReads, cuda_syncs
import evaluation.linear_head as linear_head
from evaluation.linear_head import BNLinearRecipe, bn_linear_accuracy, bn_linear_head, bn_linear_path, train_bn_linear
from evaluation.probes import choose_bn_linear_lr
from mae_core import Config

SHORT = BNLinearRecipe(epochs=30, warmup_epochs=3, batch_size=64)


def _blobs(n: int, separation: float, seed: int, offset: float = 0.0, scale: float = 1.0):
    """Two Gaussian blobs ``[n,8]`` centred at ``±separation/2`` on every axis, then shifted by
    ``offset`` and stretched by ``scale`` (what the head's BatchNorm undoes)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, 8)) + separation * (y[:, None] - 0.5)
    return (offset + scale * x).astype(np.float32), y


def test_the_head_is_batchnorm_without_affine_then_linear():
    head = bn_linear_head(12, 5, torch.Generator().manual_seed(0))
    norm, linear = head
    assert isinstance(norm, torch.nn.BatchNorm1d) and not norm.affine and norm.eps == 1e-6
    assert list(norm.parameters()) == []  # nothing to learn before the linear layer: the probe stays linear
    assert (linear.in_features, linear.out_features) == (12, 5)
    assert 0.005 < float(linear.weight.detach().std()) < 0.02 and not linear.bias.any()  # MAE: std 0.01, bias 0


def test_bn_linear_learns_a_separable_problem_at_any_feature_scale():
    # far from the origin and stretched: BatchNorm standardises what an unnormalised SGD head would choke on
    train_x, train_y = _blobs(400, 4.0, seed=0, offset=50.0, scale=30.0)
    test_x, test_y = _blobs(200, 4.0, seed=1, offset=50.0, scale=30.0)
    assert bn_linear_accuracy(train_x, train_y, test_x, test_y, lr=0.1, seed=0, recipe=SHORT) > 0.97
    head = train_bn_linear(train_x, train_y, lr=0.1, seed=0, recipe=SHORT)
    assert not head.training  # handed back in eval mode: the running statistics normalise the test split
    assert torch.allclose(head[0].running_mean, torch.from_numpy(train_x).mean(0), atol=8.0)  # ≈ 50, not 0


def test_shuffled_labels_are_near_chance_and_training_is_seeded():
    train_x, train_y = _blobs(600, 4.0, seed=0)
    test_x, test_y = _blobs(400, 4.0, seed=1)
    rng = np.random.default_rng(2)
    assert abs(bn_linear_accuracy(train_x, rng.permutation(train_y), test_x, rng.permutation(test_y),
                                  seed=0, recipe=SHORT) - 0.5) < 0.1
    first = bn_linear_path(train_x, train_y, test_x, test_y, (0.01, 1.0), seed=3, recipe=SHORT)
    assert first == bn_linear_path(train_x, train_y, test_x, test_y, (0.01, 1.0), seed=3, recipe=SHORT)


def test_the_step_size_is_chosen_on_validation():
    """A step size too small to move the head in a few epochs loses to a workable one."""
    fit_x, fit_y = _blobs(300, 3.0, seed=0)
    val_x, val_y = _blobs(100, 3.0, seed=1)
    recipe = BNLinearRecipe(epochs=3, warmup_epochs=1, batch_size=32)
    scores = bn_linear_path(fit_x, fit_y, val_x, val_y, (1e-6, 0.5), seed=0, recipe=recipe)
    assert scores[1] > scores[0]
    assert choose_bn_linear_lr(fit_x, fit_y, val_x, val_y, (0.5, 1e-6), seed=0, recipe=recipe) == 0.5


def test_single_class_training_split_predicts_that_class():
    x = np.zeros((4, 3), dtype=np.float32)
    assert bn_linear_accuracy(x, np.ones(4, int), x, np.array([1, 1, 0, 0])) == 0.5
    with pytest.raises(ValueError, match="at least 2"):
        train_bn_linear(x[:1], np.array([0]), lr=0.1, seed=0)


def test_the_recipe_reads_the_typed_keys():
    settings = Config(**{"eval.linear_head": "bn_linear", "eval.bn_linear_epochs": 20,
                         "eval.bn_linear_warmup_epochs": 2, "eval.bn_linear_batch_size": 32,
                         "eval.bn_linear_lrs": "1, 0.1"}).eval
    assert BNLinearRecipe.of(settings) == BNLinearRecipe(epochs=20, warmup_epochs=2, batch_size=32, weight_decay=0.0)
    assert settings.bn_linear_lrs == (0.1, 1.0)
    assert BNLinearRecipe() == BNLinearRecipe.of(Config().eval)  # MAE's 90 epochs, 10 of warm-up


# ----------------------------------------------------------------- on the device (issue 26)


def test_the_head_trains_on_the_device_and_reads_the_host_once_per_path(monkeypatch):
    train_x, train_y = _blobs(200, 3.0, seed=0)
    test_x, test_y = _blobs(100, 3.0, seed=1)
    recipe = BNLinearRecipe(epochs=3, warmup_epochs=1, batch_size=32)
    on_cpu = bn_linear_path(train_x, train_y, test_x, test_y, (0.01, 0.5), seed=0, recipe=recipe)
    reads = HostReads(monkeypatch)
    reads.ignore(linear_head._Draws, "of")  # the seed's draws: host tensors by design, copied once
    with cuda_syncs() as syncs:
        scores = bn_linear_path(train_x, train_y, test_x, test_y, (0.01, 0.5), seed=0, recipe=recipe, device=DEVICE)
    # Both step sizes' accuracies in one read. On CUDA that read is the only synchronising call (issue 36
    # counted 4 where the path had 2 reads: the list names the calls if any is left).
    assert reads.calls == [("tolist", DEVICE.type)], reads.calls
    assert DEVICE.type != "cuda" or len(syncs) == 1, syncs
    assert scores == pytest.approx(on_cpu, abs=0.02)  # the same seeded head and batches on every device
    head = train_bn_linear(torch.from_numpy(train_x).to(DEVICE), torch.from_numpy(train_y).to(DEVICE),
                           lr=0.1, seed=0, recipe=recipe, num_classes=2)
    assert all(t.device.type == DEVICE.type for t in [*head.parameters(), *head.buffers()])


def test_the_head_drawn_for_a_device_is_the_host_head():
    host = bn_linear_head(12, 5, torch.Generator().manual_seed(0))
    there = bn_linear_head(12, 5, torch.Generator().manual_seed(0), device=DEVICE)
    assert there[1].weight.device.type == DEVICE.type
    assert torch.equal(there[1].weight.detach().cpu(), host[1].weight.detach())
    assert not there[1].bias.detach().any()
