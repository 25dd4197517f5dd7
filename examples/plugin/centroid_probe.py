"""A plugin probe with its baselines, in one file: the nearest-centroid classifier.

Each class is represented by the mean of its training features; a test image takes the class of
the nearest mean (Euclidean, or cosine with ``eval.centroid.distance=cosine``), optionally after
standardising each feature on the training split (``eval.centroid.standardize=true``). It
needs no choice on a validation split, so it reads the training and test splits only.

``--plugin examples/plugin/centroid_probe.py eval.evaluators=risks,probes,centroid`` logs

* ``centroid_acc``: on the trained encoder's frozen features (``eval.features``),
* ``random_centroid_acc``: on the trial's encoder at initialisation (the random-init baseline),
* ``pixel_centroid_acc``: on the raw pixels,

reading the features the built-in probes extracted (once per trial), with the two baselines
kept in the study's baseline cache like the built-in ones. The baseline rows are derived from
``CENTROID_ACC`` by :class:`evaluation.evaluators.FrozenFeatureProbe`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evaluation.evaluators import FrozenFeatureProbe
from evaluation.metrics import Metric
from mae_core.evaluator import register_evaluator

CENTROID_ACC = Metric("centroid_acc", "downstream", "nearest-centroid accuracy (test split)",
                      "nearest-centroid accuracy", "fraction", False, delta=0.01)


class CentroidSettings(BaseModel):
    """The ``eval.centroid.*`` keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    distance: Literal["euclidean", "cosine"] = Field("euclidean", description="distance to the class means")
    standardize: bool = Field(False, description="standardise each feature on the training split first")


@register_evaluator
class CentroidProbe(FrozenFeatureProbe):
    """Nearest-centroid accuracy of the frozen features, beside a random-init encoder's and raw pixels'."""

    name = "centroid"
    Settings = CentroidSettings
    metrics = (CENTROID_ACC,)

    def probe(self, splits, seed: int) -> dict[str, float]:
        """``splits``: train ``[N,F]`` and test ``[N_test,F]`` features (numpy) with their labels."""
        train, test = np.asarray(splits.train, dtype=np.float64), np.asarray(splits.test, dtype=np.float64)
        if self.settings.standardize:
            mean, std = train.mean(0), train.std(0) + 1e-12
            train, test = (train - mean) / std, (test - mean) / std
        classes = np.unique(splits.train_labels)
        centroids = np.stack([train[splits.train_labels == c].mean(0) for c in classes])  # [C,F]
        if self.settings.distance == "cosine":
            unit = lambda x: x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12)  # noqa: E731
            nearest = np.argmax(unit(test) @ unit(centroids).T, axis=1)
        else:
            squared = (test ** 2).sum(1, keepdims=True) - 2 * test @ centroids.T + (centroids ** 2).sum(1)
            nearest = np.argmin(squared, axis=1)
        return {"centroid_acc": float(np.mean(classes[nearest] == splits.test_labels))}
