"""Online evaluation (``eval.every=N``): the learning curve of one run, measured while it trains.

Every N updates and after the last, :func:`mae_core.train.train` hands the model to a callback
(``on_evaluate``); the trial logs what :class:`OnlineEvaluation` measures as MLflow metric
histories with step = update, so a curve over lengths needs no run per length:

* ``online_knn_acc``: the kNN vote (:func:`evaluation.probes.knn_accuracy`, the final probe's
  classifier) on the frozen encoder's features (``eval.features``), with a fixed k =
  :data:`KNN_K` (DINO's k-NN evaluation, Caron et al. 2021), references from the fit part of
  the trial's validation split and queries from its validation part (the split the final probes
  choose on): the test split's labels are read only by the final probes;
* ``online_mae_risk`` (MAE only; the AE and DAE have no masked risk): ``R_MAE^emp`` at the
  trial's k on test images, with :data:`MASKS` uniform masks per image drawn from a generator
  seeded the same at every evaluation, so each point reads the same images under the same masks.

Each subset holds up to ``eval.online_images`` images, drawn once per trial from the trial's
seed. The evaluation does not change the training trajectory: it draws nothing from the
training sampler (its own generators), leaves torch's CPU RNG as it found it and draws nothing
from the GPU's, restores every module's train/eval mode, and computes no gradient.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mae_core.config import Config
from mae_core.objectives import empirical_mae_risk
from mae_core.patches import patchify
from mae_core.data import PatchData

from .metrics import ONLINE_METRICS
from .probes import extract_features, knn_accuracy, validation_split

KNN_K = 20  # neighbours of the online kNN vote (DINO's k-NN; capped at the references)
MASKS = 8  # uniform masks per image of the online masked risk (the same masks at every step)
METRIC_NAMES = ONLINE_METRICS  # the histories it writes (step = update), rows of the metric table
# The eval.* keys the online evaluation reads while the encoder trains: two trials that differ
# in them log different histories, so they do not share one pretraining (studies.pretrained).
READS = ("every", "online_images", "features", "val_fraction")


def _subset(indices: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Up to ``size`` of ``indices``, drawn without replacement, in ascending order."""
    return np.sort(rng.choice(indices, size=min(size, len(indices)), replace=False))


class OnlineEvaluation:
    """The fixed subsets of one trial, chosen once; call it with the model being trained."""

    def __init__(self, config: Config, data: PatchData):
        self.config = config
        size = config.eval.online_images
        labels = data.train_labels.numpy()
        split = validation_split(labels, config.eval.val_fraction, config.eval_seed)
        rng = np.random.default_rng([config.eval_seed, 5])  # its own stream (validation_split uses [seed, 1])
        references, queries = _subset(split.fit, size, rng), _subset(split.val, size, rng)
        tested = _subset(np.arange(len(data.test_images)), size, rng)

        def patches(images, index: np.ndarray) -> torch.Tensor:  # [n,M,q] float32
            return patchify(images.floats(index), data.patch_size)

        self.references, self.reference_labels = patches(data.train_images, references), labels[references]
        self.queries, self.query_labels = patches(data.train_images, queries), labels[queries]
        self.test = patches(data.test_images, tested) if config.objective_spec.masked else None

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> dict[str, float]:
        """``online_knn_acc`` (and ``online_mae_risk`` for an MAE) of ``model`` as it is now."""
        config, device = self.config, next(model.parameters()).device
        modes = [(module, module.training) for module in model.modules()]
        # torch's CPU RNG as it was (nothing here draws on the GPU's: eval mode, host generators;
        # its state is left untouched, as a captured CUDA graph's generator expects)
        with torch.random.fork_rng(devices=[]):
            try:
                pool = config.eval.features
                metrics = {"online_knn_acc": knn_accuracy(
                    extract_features(model, self.references, pool=pool), self.reference_labels,
                    extract_features(model, self.queries, pool=pool), self.query_labels, KNN_K)}
                if self.test is not None:
                    if self.test.device != device:
                        self.test = self.test.to(device)  # once: the images stay on the model's device
                    metrics["online_mae_risk"] = empirical_mae_risk(
                        model, self.test, config.num_visible, config.target, masks=MASKS,
                        generator=torch.Generator().manual_seed(config.eval_seed + 6)).value
            finally:
                for module, training in modes:
                    module.training = training
        return metrics
