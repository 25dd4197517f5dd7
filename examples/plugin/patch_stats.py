"""A worked mae-study plugin: a target of another width, a corruption, a dataset format and an
evaluator.

Load it with ``--plugin examples/plugin/patch_stats.py`` (train, run, evaluate, report) or a
study file's ``plugins: [patch_stats.py]``; it touches nothing inside the package. Shapes: B
images, M patches, q values per patch.

* ``target=patch_stats`` (``out_dim=2``): each patch summarised by its mean and population
  standard deviation, ``[B,M,q] -> [B,M,2]``. The decoder then predicts two numbers per patch:
  "how bright, how textured" instead of every pixel. Its inverse draws a prediction as a flat
  patch at the predicted mean, so reconstruction pictures still work.
* ``corruption=patch_dropout``: every patch is zeroed whole with probability ``level`` (the
  built-in ``masking`` zeroes single values), for objective=dae.
* ``dataset=keras_npz:PATH``: an ``.npz`` in Keras's layout (``mnist.npz``): ``x_train``,
  ``y_train``, ``x_test``, ``y_test``; images uint8 ``[N,H,W]`` (grey) or ``[N,H,W,C]``.
* ``eval.evaluators=risks,probes,rankme``: RankMe (Garrido et al. 2023), the effective rank of
  the frozen features of the test images, ``exp`` of the entropy of their normalised singular
  values: near 1 when the representation collapses, up to the feature width. It logs
  ``test_feature_rankme``, declared with its row of the metric table.
"""

from __future__ import annotations

import numpy as np
import torch

from evaluation.metrics import Metric
from mae_core.registry import corruption, dataset_format, evaluator, target


def _flat_patch(pred: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
    """Predicted (mean, std) ``[B,M,2]`` -> pixels ``[B,M,q]``: each patch flat at its mean."""
    return pred[..., :1].expand_as(patches)


@target("patch_stats", out_dim=2, inverse=_flat_patch)
def patch_stats(patches: torch.Tensor) -> torch.Tensor:
    """``[B,M,q] -> [B,M,2]``: per-patch mean and population standard deviation."""
    return torch.stack([patches.mean(dim=-1), patches.std(dim=-1, unbiased=False)], dim=-1)


@corruption("patch_dropout", level_at_most=1.0)
def patch_dropout(patches: torch.Tensor, level: float, generator: torch.Generator) -> torch.Tensor:
    """``[..., M, q] -> [..., M, q]``: each patch zeroed with probability ``level``. Any leading
    shape works (the finite corruption law corrupts ``[N,K,M,q]``)."""
    dropped = torch.rand(patches.shape[:-1], generator=generator, device=patches.device) < level
    return patches.masked_fill(dropped[..., None], 0.0)


@dataset_format("keras_npz")
def keras_npz(path: str):
    """``x_train, y_train, x_test, y_test`` -> uint8 ``[N,H,W,C]`` images and int ``[N]`` labels."""
    with np.load(path, allow_pickle=False) as arrays:
        x_train, y_train, x_test, y_test = (arrays[key] for key in ("x_train", "y_train", "x_test", "y_test"))
    channels_last = [x[..., None] if x.ndim == 3 else x for x in (x_train, x_test)]  # grey: C = 1
    return channels_last[0], y_train, channels_last[1], y_test


RANKME = Metric("test_feature_rankme", "bookkeeping", "effective rank of the features (RankMe)",
                "effective rank of the frozen test-split features (RankMe)", "dimensions", False)


@evaluator("rankme", metrics=[RANKME])
def rankme(model, config, data, *, baselines=None) -> dict[str, float]:
    """``exp(H(σ / ||σ||₁))`` over the singular values σ of the test features ``[N, F]``."""
    from evaluation.probes import extract_features

    features = torch.from_numpy(extract_features(model, data.test_patches, pool=config.eval.features))
    singular = torch.linalg.svdvals(features.double())
    p = singular / singular.sum() + 1e-12
    return {RANKME.name: float(torch.exp(-(p * p.log()).sum()))}
