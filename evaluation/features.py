"""What an evaluator reads: one trial (:class:`Trial`) and its frozen features, extracted once.

Every frozen-feature evaluator of a trial (the built-in linear, few-shot and kNN probes, their
layer-wise variants, a plugin's probe) reads the same features: the trained encoder's
(:data:`PRETRAINED`), the encoder's at initialisation (:data:`~mae_core.evaluator.RANDOM_INIT`,
:func:`evaluation.probes.random_init_model`: the random-init baseline) and the raw pixels
(:data:`~mae_core.evaluator.PIXELS`). :class:`TrialFeatures` extracts each set once per trial,
on first use, and hands the same arrays to every evaluator and every ``eval.repeats`` repeat,
so a plugin probe costs no second pass through the encoder. The features are the ones
:func:`evaluation.probes.extract_features` computes (a cached set is bitwise the set a
probe would extract itself), as a numpy array on the host or a tensor on the model's device
(``on_device``: the torch probes), converted without changing a value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from mae_core.config import Config
from mae_core.devices import to_device
from mae_core.evaluator import PIXELS, RANDOM_INIT
from mae_core.data import PatchData

from .probes import Features, extract_features, pixel_features, random_init_model

PRETRAINED = "pretrained"  # the trial's trained encoder
ROLES = (PRETRAINED, RANDOM_INIT, PIXELS)


@dataclass(frozen=True)
class FeatureSplits:
    """One set of features of a trial's splits: ``train [N,F]``, ``test [N_test,F]`` and their
    labels ``[N]``, ``[N_test]`` (numpy), numpy arrays or tensors on the model's device."""

    train: Features
    train_labels: np.ndarray
    test: Features
    test_labels: np.ndarray


class TrialFeatures:
    """The features of one trial, each set (role, pooling, blocks) extracted once on first use.
    ``extractions`` counts the passes through an encoder (the raw pixels need none)."""

    def __init__(self, model: nn.Module, config: Config, data: PatchData):
        self.model, self.config, self.data = model, config, data
        self.device = next(model.parameters()).device
        self.extractions = 0
        self._random_init: nn.Module | None = None
        self._sets: dict[tuple, tuple[Features, Features]] = {}
        self._results: dict[tuple, dict[str, float]] = {}

    def remembered(self, key: tuple, compute) -> dict[str, float]:
        """``compute()``'s metrics, computed once per trial for ``key`` (a probe of one set of
        features with one seed and one set of settings: the final-layer probes the frozen and the
        layer-wise evaluators both read); a copy each time."""
        if key not in self._results:
            self._results[key] = dict(compute())
        return dict(self._results[key])

    def random_init_model(self) -> nn.Module:
        """The trial's encoder at initialisation (one per trial, on the model's device)."""
        if self._random_init is None:
            self._random_init = random_init_model(self.config, self.device)
        return self._random_init

    def encoder(self, role: str) -> nn.Module:
        if role == PRETRAINED:
            return self.model
        if role == RANDOM_INIT:
            return self.random_init_model()
        raise ValueError(f"features of {role!r}: one of {', '.join(ROLES)}")

    def pair(self, role: str = PRETRAINED, *, pool: str | None = None, blocks: int | None = None,
             on_device: bool = False) -> tuple[Features, Features]:
        """``(train [N,F], test [N_test,F])`` of ``role``; ``pool``: ``eval.features`` (default the
        trial's), ``blocks``: after the first b encoder blocks; ``on_device``: tensors on the
        model's device, else numpy arrays."""
        pool = self.config.eval.features if pool is None else pool
        key = (role, None, None) if role == PIXELS else (role, pool, blocks)
        if key not in self._sets:
            self._sets[key] = self._extract(role, pool, blocks, on_device)
        return tuple(_as(x, on_device, self.device) for x in self._sets[key])

    def splits(self, role: str = PRETRAINED, **options) -> FeatureSplits:
        """:meth:`pair` with the labels: what a frozen-feature evaluator reads."""
        train, test = self.pair(role, **options)
        return FeatureSplits(train, self.data.train_labels.numpy(), test, self.data.test_labels.numpy())

    def _extract(self, role: str, pool: str, blocks: int | None, on_device: bool) -> tuple[Features, Features]:
        data = self.data
        if role == PIXELS:
            device = self.device if on_device else None
            return pixel_features(data.train_patches, device), pixel_features(data.test_patches, device)
        encoder = self.encoder(role)
        self.extractions += 1
        return tuple(extract_features(encoder, patches, pool=pool, blocks=blocks, on_device=on_device)
                     for patches in (data.train_patches, data.test_patches))


def _as(features: Features, on_device: bool, device: torch.device) -> Features:
    """The same values as a tensor on ``device`` (``on_device``) or a host numpy array."""
    if on_device:
        return features if isinstance(features, torch.Tensor) else to_device(torch.from_numpy(features), device)
    return features.cpu().numpy() if isinstance(features, torch.Tensor) else features


@dataclass
class Trial:
    """What an evaluator's ``measure(trial)`` reads: the trained ``model`` (on the trial's
    device), its ``config`` (this repeat's ``seed_eval``), its ``data``, the study's
    ``baselines`` cache (:class:`~evaluation.baselines.BaselineCache`, or None) and the
    ``features`` shared by every evaluator of the trial."""

    model: nn.Module
    config: Config
    data: PatchData
    baselines: object | None = None
    features: TrialFeatures | None = field(default=None)

    def __post_init__(self):
        if self.features is None:
            self.features = TrialFeatures(self.model, self.config, self.data)
