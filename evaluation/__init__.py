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

from mae_core.errors import UserError


def evaluate_trial(model, config, data, *, probes: bool = True, baselines=None) -> dict[str, float]:
    """Every test metric of one trained model (names are the MLflow metric names): the
    evaluators ``config.eval.evaluators`` lists, in order (:mod:`evaluation.evaluators`: the
    ``risks``, then the ``probes``, i.e. ``frozen_probes``, ``layer_probes`` and ``finetune`` with
    their baselines (:mod:`evaluation.probe_evaluators`); a plugin's). ``probes=False``
    keeps to the ``risks``. ``baselines``: a study's :class:`~evaluation.baselines.BaselineCache`.
    An evaluator that returns a metric it did not declare is an error (:class:`UndeclaredMetric`):
    every logged number is a row of the metric table.

    With ``eval.repeats`` K > 1 the evaluation runs K times, with ``seed_eval`` = s, s+1, ...,
    s+K-1 (s the trial's resolved ``seed_eval``): each metric is the mean of its K values and
    ``<metric>_sd`` their sample standard deviation (:func:`repeated_mean`). K = 1 is one
    evaluation with seed s, the numbers a trial always logged.

    Whatever the evaluators, ``data_train_test_duplicates`` (test images byte-equal to a training
    image; 0 for the built-in datasets) is logged beside them: the split's leak check is
    bookkeeping of the data, not of one evaluator."""
    from .features import TrialFeatures

    features = TrialFeatures(model, config, data)  # extracted once, read by every evaluator and repeat
    repeats = config.eval.repeats
    if repeats == 1:
        metrics = _evaluate_once(model, config, data, probes=probes, baselines=baselines, features=features)
    else:
        first = config.eval_seed
        metrics = repeated_mean([_evaluate_once(model, config.with_updates(seed_eval=first + r), data,
                                                probes=probes, baselines=baselines, features=features)
                                 for r in range(repeats)])
    metrics["data_train_test_duplicates"] = float(data.train_test_duplicates)
    return metrics


def repeated_mean(runs: list[dict[str, float]]) -> dict[str, float]:
    """K evaluations' metrics (one dict per repeat, the same names) -> each name's mean over
    the K, and ``<name>_sd``, their sample standard deviation (ddof 1)."""
    import numpy as np

    from .metrics import SD_SUFFIX

    metrics: dict[str, float] = {}
    for name in runs[0]:
        values = np.array([run[name] for run in runs], dtype=float)
        metrics[name] = float(values.mean())
        metrics[name + SD_SUFFIX] = float(values.std(ddof=1))
    return metrics


def _evaluate_once(model, config, data, *, probes: bool, baselines, features) -> dict[str, float]:
    """The evaluators once, with the config's ``seed_eval``: a class (:mod:`mae_core.evaluator`)
    measures a :class:`~evaluation.features.Trial` sharing ``features``; an ``@evaluator``
    function is called with ``(model, config, data, baselines=...)``."""
    from mae_core.plugin_checks import call_part  # a plugin's sys.exit: an error naming it
    from mae_core.registry import evaluators

    from .features import Trial

    from mae_core.evaluator import expand

    metrics: dict[str, float] = {}
    for name in expand(config.eval.evaluators):  # probes: frozen_probes, layer_probes, finetune
        if not probes and name != "risks":
            continue
        entry = evaluators.get(name)
        what = f"eval.evaluators={name}"
        if entry.evaluator_class is not None:
            trial = Trial(model, config, data, baselines=baselines, features=features)
            measured = call_part(what, entry.evaluator_class.from_config(config), trial)
        else:
            measured = call_part(what, entry.function, model, config, data, baselines=baselines)
        undeclared = sorted(key for key in measured if not declares(entry, key))
        if undeclared:
            raise UndeclaredMetric(f"evaluator {name!r} logged {', '.join(undeclared)}, which it does not declare "
                                   "(@evaluator(..., metrics=[Metric(...)]))")
        metrics.update(measured)
    return metrics


class UndeclaredMetric(UserError):
    """An evaluator measured a metric that is not among its declared rows (a plugin's mistake the
    user fixes: one line and exit status 2 from the CLI, like any :class:`UserError`)."""


def declares(entry, name: str) -> bool:
    """Whether evaluator ``entry`` declares ``name``: a class says (:meth:`Evaluator.declares
    <mae_core.evaluator.Evaluator.declares>`); a function's entry, one of its rows or a
    layer-wise probe of one (``probe_linear_acc_block2``, :func:`evaluation.metrics.block_metric`)."""
    from .metrics import block_metric, block_base

    if entry.evaluator_class is not None:
        return entry.evaluator_class.declares(name)

    declared = {row.name for row in entry.metrics}
    return name in declared or (block_metric(name) is not None and block_base(name) in declared)
