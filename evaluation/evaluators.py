"""The built-in evaluators: what a trained model is measured by, as ``eval.evaluators`` lists
them (default ``risks,probes``), registered with :func:`mae_core.registry.evaluator` as a
plugin's are.

Each declares the metric-table rows it logs (:mod:`evaluation.metrics`: the rows whose
``logged_by`` names it), and :func:`evaluation.evaluate_trial` refuses a metric an evaluator did
not declare, so every number a trial logs has a name, label, unit and direction in the table.
This module imports no torch: the config lists the evaluators' names without loading them.
"""

from __future__ import annotations

from mae_core.registry import evaluator

from .metrics import METRICS, Metric


def rows_logged_by(name: str) -> tuple[Metric, ...]:
    """The metric table's rows that evaluator ``name`` logs."""
    return tuple(m for m in METRICS.values() if m.logged_by == name)


@evaluator("risks", metrics=rows_logged_by("risks"))
def risks(model, config, data, *, baselines=None) -> dict[str, float]:
    """The spec's empirical risks on the test split (the objective's, the mean-pixel baseline's,
    an MAE's all-visible diagnostic)."""
    from .risks import reconstruction_metrics

    return reconstruction_metrics(model, config, data)


@evaluator("probes", metrics=rows_logged_by("probes"))
def probes(model, config, data, *, baselines=None) -> dict[str, float]:
    """The frozen probes (linear, few-shot, kNN; layer-wise with ``eval.probe_blocks``),
    fine-tuning with ``eval.finetune_steps > 0``, and their random-init, raw-pixel and
    from-scratch baselines (:func:`evaluation.probes.probe_metrics`)."""
    from .probes import probe_metrics

    return probe_metrics(model, config, data, baselines=baselines)
