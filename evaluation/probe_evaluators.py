"""The built-in probes as evaluators: ``frozen_probes``, ``layer_probes`` and ``finetune``, and
``probes``, the name that lists the three (the default ``eval.evaluators: [risks, probes]``).

* ``frozen_probes``: linear, few-shot and kNN accuracy of the trained encoder's frozen features
  (``probe_*``), each setting chosen on the validation split, beside the same probes of the
  encoder at initialisation (``random_probe_*``) and of the raw pixels (``pixel_probe_*``);
* ``layer_probes``: the same probes after the encoder blocks ``eval.probe_blocks`` lists
  (``probe_*_block<b>``); nothing without that key;
* ``finetune``: with ``eval.finetune_steps > 0``, fine-tuning the encoder at the fixed and at
  the validated length, partial fine-tuning (``eval.finetune_blocks``), beside training from
  scratch (``random_finetune_acc``, ``scratch_best_finetune_*``); nothing without fine-tuning.

They compute what :func:`evaluation.probes.probe_metrics` computes, with the same functions,
validation split and seeds, so ``probes`` and the three named alone log the same numbers. Their
keys predate evaluators with settings and stay ``eval.<key>`` (``flat_keys``): each evaluator's
``Settings`` is its view of :class:`~mae_core.config.EvalConfig`, and ``eval.<name>.<key>`` is
an alias of ``eval.<key>``. The layer-wise probes read the frozen probes' keys as well (the same
probes, choices and pooling). Each keeps its baselines in the study's cache under a key of its
own (:func:`evaluation.baselines.evaluator_baseline_key`). This module imports no torch.
"""

from __future__ import annotations

from typing import ClassVar

from mae_core.config import EvalConfig
from mae_core.evaluator import PIXELS, RANDOM_INIT, Evaluator, register_evaluator

from .metrics import block_base, block_metric
from .settings_views import rows_logged_by, view_of

# The keys each reads (eval.<key>): fine-tuning's are finetune_* and scratch_*, the layer-wise
# probes' probe_blocks, the frozen probes' the rest; the validation split is both's.
_SHARED_KEYS = ("evaluators", "repeats", "every", "online_images")
FINETUNE_KEYS = ("val_fraction", *(k for k in EvalConfig.model_fields if k.startswith(("finetune_", "scratch_"))))
LAYER_KEYS = ("probe_blocks",)
FROZEN_KEYS = tuple(k for k in EvalConfig.model_fields
                    if k not in (*_SHARED_KEYS, *FINETUNE_KEYS, *LAYER_KEYS) or k == "val_fraction")


class _ProbeEvaluator(Evaluator):
    """What the three share: flat keys, and the trial's validation split, random-init encoder
    and fine-tuning options, each as :func:`evaluation.probes.probe_metrics` makes them."""

    flat_keys = True

    @staticmethod
    def split(trial):
        from .probes import validation_split

        return validation_split(trial.data.train_labels.numpy(), trial.config.eval.val_fraction,
                                trial.config.eval_seed)

    def cached(self, trial, compute) -> dict[str, float]:
        """The baselines ``compute()`` measures, from the study's cache when another cell computed
        them for the same key (:func:`evaluation.baselines.evaluator_baseline_key`)."""
        from .baselines import cached_baseline

        return cached_baseline(self, trial, "baselines", compute)


@register_evaluator
class FrozenProbes(_ProbeEvaluator):
    """Linear, few-shot and kNN accuracy of the frozen features, each setting chosen on the
    validation split, beside a random-init encoder's and the raw pixels'."""

    name = "frozen_probes"
    Settings = view_of("FrozenProbeSettings", FROZEN_KEYS)
    metrics = rows_logged_by("frozen_probes")
    baselines = {"random_probe_": RANDOM_INIT, "pixel_probe_": PIXELS}
    # Smoke: one candidate per probe choice and one few-shot draw (the choice code still runs on
    # the validation split, without the grid's dozens of logistic-regression fits)
    smoke = {"linear_cs": "1.0", "knn_ks": "5", "fewshot_draws": 1}

    def measure(self, trial) -> dict[str, float]:
        from .probes import frozen_baselines, frozen_probes, split_sizes

        config, features, split = trial.config, trial.features, self.split(trial)
        settings, seed = config.eval, config.eval_seed
        metrics = frozen_probes(trial.model, trial.data, split, settings, seed=seed, features=features)
        metrics.update(self.cached(trial, lambda: frozen_baselines(
            features.random_init_model(), trial.data, split, settings, seed=seed, features=features)))
        metrics.update(split_sizes(trial.data, split))
        return metrics


@register_evaluator
class LayerProbes(_ProbeEvaluator):
    """The frozen probes after each encoder block ``eval.probe_blocks`` lists (``probe_*_block<b>``),
    with the final layer's probes, choices and pooling."""

    name = "layer_probes"
    Settings = view_of("LayerProbeSettings", (*LAYER_KEYS, *FROZEN_KEYS))
    layer_of: ClassVar[str] = FrozenProbes.name  # whose rows its names derive from

    @classmethod
    def declares(cls, name: str) -> bool:
        """``probe_<x>_block<b>`` of a frozen probe's row ``probe_<x>``."""
        return block_metric(name) is not None and block_base(name) in {row.name for row in FrozenProbes.metrics}

    def active(self) -> bool:
        return bool(self.settings.probe_blocks)

    def measure(self, trial) -> dict[str, float]:
        from .probes import _depth, frozen_probes, layer_probes

        config, split = trial.config, self.split(trial)
        settings, seed = config.eval, config.eval_seed
        if not settings.probe_blocks:
            return {}
        final = (frozen_probes(trial.model, trial.data, split, settings, seed=seed, features=trial.features)
                 if _depth(trial.model) in settings.probe_blocks else {})  # read, not fitted, after frozen_probes
        return layer_probes(trial.model, trial.data, split, settings, seed=seed, final=final, features=trial.features)


@register_evaluator
class FineTune(_ProbeEvaluator):
    """Fine-tuning at the fixed and at the validated length, partial fine-tuning, beside
    training from scratch for as many updates and for its own validated length."""

    name = "finetune"
    Settings = view_of("FineTuneSettings", FINETUNE_KEYS)
    metrics = rows_logged_by("finetune")
    baselines = {"random_finetune_": RANDOM_INIT, "scratch_best_finetune_": RANDOM_INIT}

    def active(self) -> bool:
        return self.settings.finetune_steps > 0

    def measure(self, trial) -> dict[str, float]:
        from .probes import _finetune_options, pretrained_finetune, scratch_baselines

        config, data, split = trial.config, trial.data, self.split(trial)
        settings = config.eval
        if settings.finetune_steps == 0:
            return {}
        options = _finetune_options(settings, data, config.eval_seed)
        metrics = pretrained_finetune(trial.model, data, split, settings,
                                      options=dict(options, layer_decay=settings.finetune_layer_decay))
        metrics.update(self.cached(trial, lambda: scratch_baselines(
            trial.features.random_init_model(), data, split, settings, options=options)))
        return metrics


PARTS = (FrozenProbes, LayerProbes, FineTune)


@register_evaluator
class Probes(_ProbeEvaluator):
    """The frozen probes (linear, few-shot, kNN; layer-wise with ``eval.probe_blocks``),
    fine-tuning with ``eval.finetune_steps > 0``, and their random-init, raw-pixel and
    from-scratch baselines: ``frozen_probes``, ``layer_probes`` and ``finetune``, in that order."""

    name = "probes"
    parts = tuple(part.name for part in PARTS)
    Settings = view_of("ProbeSettings", tuple(dict.fromkeys(k for part in PARTS for k in part.Settings.model_fields)))
    metrics = tuple(row for part in PARTS for row in part.metrics)
    baselines = {prefix: how for part in PARTS for prefix, how in part.baselines.items()}

    @classmethod
    def declares(cls, name: str) -> bool:
        return any(part.declares(name) for part in PARTS)

    def measure(self, trial) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for part in PARTS:
            metrics.update(part(part.settings_of(trial.config.eval)).measure(trial))
        return metrics
