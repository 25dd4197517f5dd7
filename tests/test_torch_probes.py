"""The frozen probes in torch (issue 36: a trial on CUDA fits them on the device) against
scikit-learn's on the same features. On the CPU the torch path is forced (a tensor of features,
or ``backend="torch"``); ``MAE_TEST_DEVICE=cuda`` (benchmarks/gpu_check.sh) runs the device test
on the GPU."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from device_checks import DEVICE
from evaluation import torch_probes
from evaluation.probes import (_linear_path, extract_features, frozen_probes, knn_accuracy, probes_on_device,
                               random_init_model, validation_split)
from mae_core import Config
from mae_core.config import EvalConfig
from mae_core.data import prepare_data

HALF_A_POINT = 0.005


@functools.cache
def _digits():
    """A random-init encoder's features of the whole digits split (1,437 train, 360 test images):
    a test set where half a point is under two images."""
    config = Config(dataset="digits", device="cpu")
    data = prepare_data(config)
    model = random_init_model(config)
    return (config, data, model, extract_features(model, data.train_patches), data.train_labels.numpy(),
            extract_features(model, data.test_patches), data.test_labels.numpy())


def test_the_torch_linear_probe_scores_as_scikit_learns_within_half_a_point():
    _, _, _, train_x, train_y, test_x, test_y = _digits()
    grid = (0.1, 1.0)
    by_sklearn = _linear_path(train_x, train_y, test_x, test_y, grid)
    by_torch = _linear_path(torch.from_numpy(train_x), train_y, torch.from_numpy(test_x), test_y, grid)
    assert by_torch == pytest.approx(by_sklearn, abs=HALF_A_POINT)
    assert by_sklearn[0] != by_sklearn[1]  # the path's C matters: the comparison is of two fits


@pytest.mark.parametrize("k", [1, 5, 20])
def test_the_torch_knn_vote_scores_as_scikit_learns_within_half_a_point(k):
    _, _, _, train_x, train_y, test_x, test_y = _digits()
    by_sklearn = knn_accuracy(train_x, train_y, test_x, test_y, k)
    by_torch = knn_accuracy(torch.from_numpy(train_x), train_y, torch.from_numpy(test_x), test_y, k)
    assert by_torch == pytest.approx(by_sklearn, abs=HALF_A_POINT)


def test_frozen_probes_forced_to_torch_choose_on_validation_and_score_as_scikit_learn():
    config, data, model, *_ = _digits()
    settings = EvalConfig(linear_cs=(0.1, 1.0), knn_ks=(5, 20), fewshot_draws=1)
    split = validation_split(data.train_labels.numpy(), settings.val_fraction, seed=0)
    by_sklearn = frozen_probes(model, data, split, settings, seed=0, backend="sklearn")
    by_torch = frozen_probes(model, data, split, settings, seed=0, backend="torch")
    assert by_torch.keys() == by_sklearn.keys()
    for name in ("probe_linear_acc", "probe_fewshot_acc", "probe_knn_acc"):
        assert by_torch[name] == pytest.approx(by_sklearn[name], abs=HALF_A_POINT), name
    assert by_torch["probe_knn_k"] == by_sklearn["probe_knn_k"]


def test_the_torch_probes_run_where_the_model_is_and_auto_means_cuda():
    assert probes_on_device("auto", torch.device("cuda")) and not probes_on_device("auto", torch.device("cpu"))
    assert probes_on_device("torch", torch.device("cpu")) and not probes_on_device("sklearn", torch.device("cuda"))
    with pytest.raises(ValueError, match="probe backend 'gpu': one of auto, sklearn, torch"):
        probes_on_device("gpu", torch.device("cpu"))


def test_standardising_leaves_a_constant_feature_unscaled_as_scikit_learn():
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    train, test = rng.normal(size=(50, 3)), rng.normal(size=(10, 3))
    train[:, 1] = 4.0
    train_z, test_z = torch_probes.standardise(torch.from_numpy(train), torch.from_numpy(test))
    scaler = StandardScaler().fit(train)
    np.testing.assert_allclose(train_z.numpy(), scaler.transform(train), atol=1e-12)
    np.testing.assert_allclose(test_z.numpy(), scaler.transform(test), atol=1e-12)


def test_the_torch_probes_fit_on_the_device_and_match_the_cpu():
    """On ``MAE_TEST_DEVICE`` (CUDA in the GPU check): the same path and vote on the device as
    on the CPU (the summation order may differ, so within half a point)."""
    _, _, _, train_x, train_y, test_x, test_y = _digits()
    there = [torch.from_numpy(a).to(DEVICE) for a in (train_x, test_x)]
    on_cpu = _linear_path(torch.from_numpy(train_x), train_y, torch.from_numpy(test_x), test_y, (1.0,))
    on_device = _linear_path(there[0], train_y, there[1], test_y, (1.0,))
    assert on_device == pytest.approx(on_cpu, abs=HALF_A_POINT)
    assert knn_accuracy(there[0], train_y, there[1], test_y, 5) == pytest.approx(
        knn_accuracy(torch.from_numpy(train_x), train_y, torch.from_numpy(test_x), test_y, 5), abs=HALF_A_POINT)
