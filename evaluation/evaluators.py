"""The built-in evaluators, as classes (:mod:`mae_core.evaluator`): what a trained model is
measured by, as ``eval.evaluators`` lists them (default ``risks,probes``), registered with
:func:`~mae_core.evaluator.register_evaluator` as a plugin's are; and ``online``, which runs
while the model trains (every ``eval.every`` updates), never after.

Each declares the metric-table rows it logs (:mod:`evaluation.metrics`: the rows whose
``logged_by`` names it), and :func:`evaluation.evaluate_trial` refuses a metric an evaluator did
not declare, so every number a trial logs has a name, label, unit and direction in the table.
The built-ins' keys predate evaluators with settings: they stay ``eval.<key>`` (the params every
stored run has), and ``eval.<name>.<key>`` is the same key (``eval.probes.fewshot=4`` is
``eval.fewshot=4``).

:class:`FrozenFeatureProbe` is the base of a probe of frozen features with baselines: a
subclass measures one :class:`~evaluation.features.FeatureSplits`, and the base measures it on
the trained encoder's features and on each baseline's (random init, raw pixels), the features
extracted once per trial (:class:`~evaluation.features.TrialFeatures`), the baselines kept in
the study's cache like the built-in ones. ``examples/plugin/centroid_probe.py`` is one.
This module imports no torch: the config lists the evaluators' names without loading them.
"""

from __future__ import annotations

import dataclasses

from mae_core.evaluator import PIXELS, RANDOM_INIT, Evaluator, register_evaluator

from .metrics import METRICS, ONLINE_METRICS
from .settings_views import rows_logged_by, view_of

# The online evaluation's keys (evaluation.online)
_ONLINE_KEYS = ("every", "online_images")


@register_evaluator
class Risks(Evaluator):
    """The spec's empirical risks on the test split (the objective's, the mean-pixel baseline's,
    an MAE's all-visible diagnostic)."""

    name = "risks"
    metrics = rows_logged_by("risks")
    needs_labels = False
    flat_keys = True

    def measure(self, trial) -> dict[str, float]:
        from .risks import reconstruction_metrics

        return reconstruction_metrics(trial.model, trial.config, trial.data)


# frozen_probes, layer_probes, finetune and probes, the name that lists the three
from . import probe_evaluators  # noqa: E402,F401  (registers them, after risks, before online)


@register_evaluator
class Online(Evaluator):
    """kNN accuracy and masked risk every ``eval.every`` updates, while the model trains
    (:mod:`evaluation.online`), logged as histories with step = update."""

    name = "online"
    Settings = view_of("OnlineSettings", _ONLINE_KEYS)
    metrics = tuple(METRICS[name] for name in ONLINE_METRICS)
    during_training = True
    flat_keys = True

    def active(self) -> bool:
        return self.settings.every > 0

    def during(self, config, data):
        """``measure(model) -> {metric: value}`` for the model as it is at an update: the subsets
        chosen once per trial (:class:`evaluation.online.OnlineEvaluation`)."""
        from .online import OnlineEvaluation

        return OnlineEvaluation(config, data)


# ------------------------------------------------------------------- a plugin's frozen probe


class FrozenFeatureProbe(Evaluator):
    """A probe of frozen features with its baselines. A subclass sets ``name``, ``metrics`` (its
    rows on the trained encoder, ``kind="downstream"``), optionally ``Settings`` and
    ``baselines`` (default: random init as ``random_``, raw pixels as ``pixel_``), and defines
    ``probe(splits, seed) -> {metric: value}``. The baselines' rows (``random_<metric>``,
    ``pixel_<metric>``) are derived from its rows, and each pretrained row names them as its
    references, so tables and figures set them side by side as the built-in probes'."""

    baselines = {"random_": RANDOM_INIT, "pixel_": PIXELS}

    def __init_subclass__(cls, **options):
        super().__init_subclass__(**options)
        if "metrics" in cls.__dict__:  # its own rows, not a parent's (already derived)
            cls.metrics = baseline_rows(cls.metrics, cls.baselines)

    def probe(self, splits, seed: int) -> dict[str, float]:
        raise NotImplementedError(f"evaluator {self.name!r} does not define probe(splits, seed)")

    def measure(self, trial) -> dict[str, float]:
        from .baselines import cached_baseline  # imports torch, which this module is read without

        seed = trial.config.eval_seed
        metrics = dict(self.probe(trial.features.splits(), seed))
        for prefix, reference in self.baselines.items():
            def compute(prefix=prefix, reference=reference) -> dict[str, float]:
                return {prefix + k: v for k, v in self.probe(trial.features.splits(reference), seed).items()}

            metrics.update(cached_baseline(self, trial, prefix + reference, compute))
        return metrics


_REFERENCE_WORDS = {RANDOM_INIT: ("random init", "of a random-init encoder"), PIXELS: ("raw pixels", "on raw pixels")}


def baseline_rows(rows: tuple, baselines: dict[str, str]) -> tuple:
    """``rows`` (measured on the trained encoder) with each one's references named, then a
    ``reference`` row per baseline prefix: ``centroid_acc`` -> ``random_centroid_acc``
    (label "... (random init)") and ``pixel_centroid_acc`` ("... (raw pixels)")."""
    derived, own = [], []
    for row in rows:
        names = {prefix: prefix + row.name for prefix in baselines}
        random_names = [n for p, n in names.items() if baselines[p] == RANDOM_INIT]
        others = tuple(n for n in names.values() if n not in random_names[:1])
        own.append(dataclasses.replace(row, reference=row.reference or (random_names[0] if random_names else None),
                                       baselines=row.baselines or others))
        for prefix, reference in baselines.items():
            short, plain = _REFERENCE_WORDS[reference]
            derived.append(dataclasses.replace(
                row, name=prefix + row.name, kind="reference", label=f"{row.label} ({short})",
                plain=f"{row.plain} {plain}", reference=None, baselines=(), reference_name=short,
                column=None, figure=None, finetune_panel=0, table_row=short))
    return (*own, *derived)
