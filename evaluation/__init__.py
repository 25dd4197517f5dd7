"""evaluation: what a trial measures once training ends, between the engine and the studies.

``risks`` (the spec's empirical risks on the test split), ``probes`` (linear, few-shot, kNN,
fine-tuning, with their random-init, raw-pixel and tuned from-scratch baselines, every choice
made on a validation split), ``linear_head`` (the MAE paper's BatchNorm + linear probe head),
``finetune_recipe`` (fine-tuning's layer-wise decay and schedule), ``online`` (kNN accuracy and
masked risk every ``eval.every`` updates, during training), ``reconstructions`` (the
figure of what the model reconstructs), and ``metrics``: the one table of metric names, labels,
units, directions, references and the axes that change what a metric means, which progress
lines, the report's frame, figures and statistics all read. Imports the engine (``mae_core``),
never Ray or MLflow.
"""

from __future__ import annotations


def evaluate_trial(model, config, data, *, probes: bool = True, baselines=None) -> dict[str, float]:
    """Every test metric of one trained model (names are the MLflow metric names): the risks,
    ``data_train_test_duplicates`` (test images byte-equal to a training image; 0 for the
    built-ins), then, unless ``probes=False``, the probes, their baselines and fine-tuning of
    ``config.eval``; ``baselines``: a study's :class:`~evaluation.baselines.BaselineCache`."""
    from .probes import probe_metrics
    from .risks import reconstruction_metrics

    metrics = reconstruction_metrics(model, config, data)
    metrics["data_train_test_duplicates"] = float(data.train_test_duplicates)
    if probes:
        metrics.update(probe_metrics(model, config, data, baselines=baselines))
    return metrics
