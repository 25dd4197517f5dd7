"""The frozen probes in torch, on the features' device (issue 36): what a trial on CUDA runs
instead of scikit-learn, so its features never leave the GPU.

They are the scikit-learn probes of :mod:`evaluation.probes` restated, not new ones:

* the linear probe: features standardised with the training split's mean and population
  standard deviation (``StandardScaler``; a constant feature is left unscaled), then multinomial
  logistic regression minimising scikit-learn's objective, ``mean cross-entropy + ‖W‖² / (2·C·n)``
  (the intercept not penalised), by L-BFGS (history 10, strong Wolfe line search, at most
  :data:`~evaluation.probes.LOGISTIC_MAX_ITER` iterations, stopping when every gradient entry is
  below 1e-4, scikit-learn's ``tol``), from zeros, each C of a path warm-started from the previous
  one's solution, in float64; ties between classes go to the first, as ``argmax``;
* the kNN vote: the k most cosine-similar training rows (k capped at the training size, the
  similarity in the features' own dtype), a majority vote with ties to the smallest label, as
  ``KNeighborsClassifier(metric="cosine")``.

The regularisation C, the few-shot draws and the kNN k are chosen on the same validation split by
the same code (:func:`evaluation.probes.feature_probes`): only the fit differs. Each path returns
its accuracies in one host read. Shapes: ``N`` images, ``F`` features, ``K`` classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

GRADIENT_TOLERANCE = 1e-4  # scikit-learn's LogisticRegression(tol=1e-4), the lbfgs gradient tolerance
HISTORY = 10  # scipy's L-BFGS-B default (maxcor), which scikit-learn's lbfgs solver uses
KNN_CHUNK = 1024  # test rows per similarity block: [chunk, N] floats at a time


def _labels(labels: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(labels, dtype=torch.long).to(device, non_blocking=True)


def standardise(train_x: torch.Tensor, test_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``StandardScaler().fit(train_x)`` applied to both, in float64 on their device."""
    train_x, test_x = train_x.double(), test_x.double()
    mean = train_x.mean(0)
    scale = train_x.std(0, correction=0)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # as scikit-learn: a constant feature unscaled
    return (train_x - mean) / scale, (test_x - mean) / scale


def _fit_logistic(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, C: float,
                  max_iter: int) -> None:
    """Minimise ``mean CE(x·Wᵀ + b, y) + ‖W‖² / (2·C·n)`` over ``weight [K,F]`` and ``bias [K]`` in place."""
    weight.requires_grad_(True)
    bias.requires_grad_(True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iter, history_size=HISTORY,
                                  tolerance_grad=GRADIENT_TOLERANCE, tolerance_change=1e-12,
                                  line_search_fn="strong_wolfe")
    penalty = 1.0 / (2.0 * C * len(x))

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(x @ weight.T + bias, y) + penalty * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(objective)
    weight.requires_grad_(False)
    bias.requires_grad_(False)


def logistic_path(train_x: torch.Tensor, train_y: np.ndarray | torch.Tensor, test_x: torch.Tensor,
                  test_y: np.ndarray | torch.Tensor, grid: Sequence[float], *, max_iter: int) -> list[float]:
    """Test accuracy of the standardised logistic probe at each C of ``grid`` (one path, each fit
    warm-started from the last), on ``train_x``'s device; one host read for the whole path. The
    classes are the labels 0..max(train_y) (a label the training split lacks gets a class whose
    logit the penalty keeps at the bias's level, as scikit-learn has no such class at all)."""
    device = train_x.device
    y, test_labels = _labels(train_y, device), _labels(test_y, device)
    train_z, test_z = standardise(train_x, test_x)
    classes = int(np.max(np.asarray(train_y))) + 1  # host labels: no device read
    weight = torch.zeros(classes, train_z.shape[1], dtype=torch.float64, device=device)
    bias = torch.zeros(classes, dtype=torch.float64, device=device)
    present = torch.zeros(classes, dtype=torch.bool, device=device)
    present[y] = True  # a class absent from the training split is never predicted (scikit-learn's classes_)
    correct = []
    for c in grid:
        _fit_logistic(train_z, y, weight, bias, float(c), max_iter)
        with torch.no_grad():
            logits = (test_z @ weight.T + bias).masked_fill(~present, float("-inf"))
            correct.append((logits.argmax(1) == test_labels).sum())
    return [count / len(test_labels) for count in torch.stack(correct).tolist()]


def knn_accuracy(train_x: torch.Tensor, train_y: np.ndarray | torch.Tensor, test_x: torch.Tensor,
                 test_y: np.ndarray | torch.Tensor, k: int) -> float:
    """Accuracy of the k-nearest-neighbour vote under cosine distance, on ``train_x``'s device."""
    device = train_x.device
    y, test_labels = _labels(train_y, device), _labels(test_y, device)
    k = min(int(k), len(train_x))
    classes = int(np.max(np.asarray(train_y))) + 1
    train_unit = F.normalize(train_x, dim=1)  # in the features' dtype, as scikit-learn (float32 features:
    # a float64 similarity ranks near-ties at the k-th neighbour otherwise, two of 360 digits votes)
    correct = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, len(test_x), KNN_CHUNK):
        similarity = F.normalize(test_x[start:start + KNN_CHUNK], dim=1) @ train_unit.T
        nearest = similarity.topk(k, dim=1).indices  # [chunk, k]
        votes = F.one_hot(y[nearest], classes).sum(1)  # [chunk, K]
        correct += (votes.argmax(1) == test_labels[start:start + KNN_CHUNK]).sum()  # ties: the smallest label
    return int(correct) / len(test_labels)
