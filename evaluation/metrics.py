"""The one table of what a trial logs: every metric's name, label, unit, direction and reference.

Progress lines, the report's frame, figures, statistics and tables all read this table, so a
metric is named and described once. Kinds: ``risk`` (the spec's empirical risks), ``baseline``
(the mean-pixel predictor's risk), ``diagnostic`` (a number in target units that is *not* one
of the spec's risks, e.g. an MAE's error with every patch visible, outside ``V_k``: never
correlated with probes, never plotted as a risk), ``downstream`` (probes, fine-tuning),
``reference`` (their baselines: random init, raw pixels, from scratch) and ``bookkeeping``
(compute included: :data:`COMPUTE_METRICS`). Layer-wise probe names (``eval.probe_blocks``:
``probe_linear_acc_block2``) are not rows of their own: a lookup derives them from the base row
(:func:`block_metric`). A plugin evaluator's rows (``@evaluator(name, metrics=...)``) are found
by a lookup as well, and :func:`all_rows` lists them after the fixed ones. Each row says which
evaluator logs it (``logged_by``) and where the paper's table and the report's figures show it.
``RISK_MEANING_AXES`` lists the config axes across which a
risk is not the same quantity (a "best risk" or a risk-vs-quality correlation across such cells
compares unlike numbers).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass

ACCURACY = "accuracy (test split)"
ACCURACY_DELTA = 0.01  # one point: the default smallest accuracy difference a claim cares about


@dataclass(frozen=True)
class Metric:
    name: str  # the MLflow metric name
    kind: str  # risk | baseline | diagnostic | downstream | reference | bookkeeping
    label: str  # for an axis: what it is
    plain: str  # for a sentence
    unit: str  # "fraction" (accuracies), "target" (squared error in target units), "s", ...
    lower_is_better: bool
    reference: str | None = None  # the metric it is read against (random init, mean pixel)
    reference_name: str | None = None  # how this metric is called in a legend when it is a reference
    baselines: tuple[str, ...] = ()  # further metrics it is read against (raw pixels, tuned from scratch)
    # The smallest effect of interest a claim on this metric uses when it names none (metric
    # units): one point of accuracy. None where no default makes sense across studies (a risk's
    # scale depends on the target and the data), so a claim on it must give its own ``delta``.
    delta: float | None = None
    # Who logs it: an evaluator of ``eval.evaluators`` ("risks", "frozen_probes", "finetune", a
    # plugin's; each built-in's rows are the ones naming it), or "training" (the loop, the
    # trial's clock and compute). Empty: by kind (risk, baseline, diagnostic -> "risks";
    # downstream, reference -> "probes", the name that lists the built-in probes).
    logged_by: str = ""
    column: str | None = None  # its column in the paper's Table 1 (analysis.labels.table_columns)
    column_rank: int = 0  # the columns' order (MAE Table 1: fine-tuning first)
    table_row: str | None = None  # a reference's row under that table (analysis.labels.baseline_rows)
    figure: str | None = None  # a report figure it is a panel of ("probes": analysis.report_figures.probe_panels)
    # Its rank as MAE Figure 5's second panel, beside the linear probe (analysis.figures.probe_and_finetune):
    # the present row of the lowest rank is drawn (partial fine-tuning, else fine-tuning, else kNN
    # when no trial was fine-tuned); 0 = never
    finetune_panel: int = 0
    # The values it can take (low, high), where the unit bounds them: a fraction lies in [0, 1].
    # None: unbounded (a risk in target units). A claim's delta on it is below high - low.
    bounds: tuple[float, float] | None = None

    def __post_init__(self):
        if self.bounds is None and self.unit == "fraction":
            object.__setattr__(self, "bounds", (0.0, 1.0))
        if not self.logged_by:
            by_kind = {"risk": "risks", "baseline": "risks", "diagnostic": "risks",
                       "downstream": "probes", "reference": "probes"}
            object.__setattr__(self, "logged_by", by_kind.get(self.kind, "training"))


def _risk(name: str, label: str, plain: str) -> Metric:
    return Metric(name, "risk", label, plain, "target", True, "test_baseline_risk")


# The built-in probe evaluators (evaluation.probe_evaluators) that log the rows below
FROZEN, FINETUNE = "frozen_probes", "finetune"


def _probe(name: str, what: str, plain: str, reference: str | None, baselines: tuple[str, ...] = (),
           logged_by: str = FROZEN, **table) -> Metric:
    return Metric(name, "downstream", f"{what} {ACCURACY}", plain, "fraction", False, reference,
                  baselines=baselines, delta=ACCURACY_DELTA, logged_by=logged_by, **table)


def _random(name: str, plain: str, reference_name: str | None = None, logged_by: str = FROZEN) -> Metric:
    return Metric(name, "reference", f"{plain} (random init)", f"{plain} of a random-init encoder",
                  "fraction", False, reference_name=reference_name, delta=ACCURACY_DELTA, table_row="random init",
                  logged_by=logged_by)


def _pixel(name: str, plain: str) -> Metric:
    return Metric(name, "reference", f"{plain} (raw pixels)", f"{plain} on raw pixels",
                  "fraction", False, reference_name="raw pixels", delta=ACCURACY_DELTA, table_row="raw pixels",
                  logged_by=FROZEN)


def _chosen(prefix: str, whose: str) -> tuple[Metric, ...]:
    """The settings a probe chose on the validation split (bookkeeping)."""
    return (
        Metric(f"{prefix}linear_c", "bookkeeping", f"linear-probe C ({whose})",
               f"logistic-regression strength C chosen on validation ({whose})", "C", False, logged_by=FROZEN),
        # eval.linear_head=bn_linear logs its chosen SGD base step size instead of a C
        Metric(f"{prefix}linear_lr", "bookkeeping", f"linear-probe step size ({whose})",
               f"bn_linear head's SGD base step size chosen on validation ({whose})",
               "step size per 256 images", False, logged_by=FROZEN),
        Metric(f"{prefix}fewshot_c", "bookkeeping", f"few-shot probe C ({whose})",
               f"few-shot logistic-regression strength C chosen on validation ({whose})", "C", False,
               logged_by=FROZEN),
        Metric(f"{prefix}knn_k", "bookkeeping", f"kNN k ({whose})",
               f"kNN neighbour count chosen on validation ({whose})", "neighbours", False, logged_by=FROZEN),
    )


BLOCK_SUFFIX = "_block"  # probe_linear_acc_block2: the probe of the features after encoder block 2
_BLOCK_NAME = re.compile(r"(probe_\w+?)_block([1-9][0-9]*)")


def block_metric_name(base: str, block: int) -> str:
    """``eval.probe_blocks``' name of ``base`` (a ``probe_*`` metric) read after block ``block``."""
    return f"{base}{BLOCK_SUFFIX}{block}"


class _MetricTable(dict):
    """The table as a dict of its fixed rows; a lookup (``[]``, ``get``, ``in``) of a layer-wise
    probe name ``probe_*_blockN`` (``eval.probe_blocks``) also finds its row, derived from the
    base row by :func:`block_metric`. Iteration lists the fixed rows only."""

    def __missing__(self, name: str) -> Metric:
        row = block_metric(name) or repeats_sd_metric(name) or _plugin_row(name)
        if row is None:
            raise KeyError(name)
        return row

    def get(self, name, default=None):
        return self[name] if name in self else default

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or block_metric(name) is not None or repeats_sd_metric(name) is not None or (
            isinstance(name, str) and _plugin_row(name) is not None)


def block_metric(name: str) -> Metric | None:
    """The row of ``probe_<x>_blockN`` (``eval.probe_blocks``): the base row ``probe_<x>`` with
    "after block N" in its label and sentence, the same unit, direction, delta and references
    (the random-init and raw-pixel references stay the final-layer ones); None for any other name."""
    match = _BLOCK_NAME.fullmatch(name) if isinstance(name, str) else None
    base = dict.get(METRICS, match.group(1)) if match else None
    if base is None:
        return None
    block = int(match.group(2))
    return dataclasses.replace(base, name=name, label=f"{base.label}, after block {block}",
                               plain=f"{base.plain} after encoder block {block}")


SD_SUFFIX = "_sd"  # eval.repeats > 1: probe_linear_acc_sd, the spread of probe_linear_acc over the repeats


def repeats_sd_metric(name: str) -> Metric | None:
    """The row of ``<metric>_sd`` (``eval.repeats`` > 1: the sample standard deviation of
    ``<metric>`` over a trial's evaluation repeats): bookkeeping, in the base row's unit, logged
    by the same evaluator; None for any other name."""
    if not isinstance(name, str) or not name.endswith(SD_SUFFIX):
        return None
    base_name = name[: -len(SD_SUFFIX)]
    base = dict.get(METRICS, base_name) or block_metric(base_name) or _plugin_row(base_name)
    if base is None:
        return None
    return Metric(name, "bookkeeping", f"{base.label}, sd over eval.repeats",
                  f"the standard deviation of {base.plain} over the evaluation repeats", base.unit, False,
                  logged_by=base.logged_by)


def block_base(name: str) -> str | None:
    """The base row of a layer-wise probe name: ``probe_linear_acc_block2`` -> ``probe_linear_acc``."""
    match = _BLOCK_NAME.fullmatch(name) if isinstance(name, str) else None
    return match.group(1) if match else None


def block_metric_names(names) -> list[str]:
    """The layer-wise probe names among ``names`` (e.g. a frame's columns): by base row, then block."""
    order = {name: i for i, name in enumerate(METRICS)}
    found = [n for n in names if isinstance(n, str) and not dict.__contains__(METRICS, n) and block_metric(n)]
    return sorted(found, key=lambda n: (order[_BLOCK_NAME.fullmatch(n).group(1)],
                                        int(_BLOCK_NAME.fullmatch(n).group(2))))


METRICS: dict[str, Metric] = _MetricTable({m.name: m for m in (
    _risk("test_mae_risk", "masked MSE", "masked risk"),
    _risk("test_rec_risk", "reconstruction MSE", "reconstruction risk"),
    _risk("test_den_risk", "denoising MSE", "denoising risk"),
    Metric("test_allvisible_rec_risk", "diagnostic", "all-visible reconstruction MSE (outside V_k)",
           "MAE error with every patch visible (not a risk of the spec)", "target", True),
    Metric("test_mae_risk_masks", "bookkeeping", "masks per image of the masked risk",
           "masks per test image the masked risk averaged over (C(M,k) when exact)", "masks", False,
           logged_by="risks"),
    Metric("test_mae_risk_stderr", "bookkeeping", "masked MSE standard error",
           "standard error of the masked risk", "target", True, logged_by="risks"),
    Metric("test_baseline_risk", "baseline", "mean-pixel baseline MSE", "mean-pixel baseline risk",
           "target", True, reference_name="mean-pixel baseline"),
    _probe("probe_linear_acc", "linear probe", "linear-probe accuracy", "random_probe_linear_acc",
           ("pixel_probe_linear_acc",), column="linear", column_rank=1, figure="probes"),
    _probe("probe_fewshot_acc", "few-shot probe", "few-shot probe accuracy", "random_probe_fewshot_acc",
           ("pixel_probe_fewshot_acc",), column="few-shot", column_rank=2, figure="probes"),
    _probe("probe_knn_acc", "kNN", "kNN accuracy", "random_probe_knn_acc", ("pixel_probe_knn_acc",),
           column="kNN", column_rank=3, figure="probes", finetune_panel=3),
    _probe("finetune_acc", "fine-tuning", "fine-tuning accuracy", "random_finetune_acc",
           ("scratch_best_finetune_acc",), FINETUNE, column="fine-tune", column_rank=0, finetune_panel=2),
    # The like-for-like pair: the pretrained model's length chosen on validation from the same
    # candidates, by the same selection, as the from-scratch model's (scratch_best_finetune_acc).
    _probe("finetune_best_acc", "fine-tuning (tuned length)", "fine-tuning accuracy at the length best on validation",
           "scratch_best_finetune_acc", logged_by=FINETUNE),
    _probe("partial_finetune_acc", "partial fine-tuning", "partial fine-tuning accuracy", None, logged_by=FINETUNE,
           figure="probes", finetune_panel=1),
    _random("random_probe_linear_acc", "linear-probe accuracy"),
    _random("random_probe_fewshot_acc", "few-shot probe accuracy"),
    _random("random_probe_knn_acc", "kNN accuracy"),
    _random("random_finetune_acc", "fine-tuning accuracy", reference_name="from scratch", logged_by=FINETUNE),
    _pixel("pixel_probe_linear_acc", "linear-probe accuracy"),
    _pixel("pixel_probe_fewshot_acc", "few-shot probe accuracy"),
    _pixel("pixel_probe_knn_acc", "kNN accuracy"),
    Metric("scratch_best_finetune_acc", "reference", "fine-tuning accuracy (from scratch, tuned length)",
           "accuracy of a model trained from scratch for the length best on validation", "fraction",
           False, reference_name="from scratch (tuned length)", delta=ACCURACY_DELTA, table_row="from scratch",
           logged_by=FINETUNE),
    Metric("scratch_best_finetune_steps", "bookkeeping", "from-scratch training length (updates)",
           "from-scratch training length chosen on validation", "steps", False, logged_by=FINETUNE),
    Metric("finetune_best_steps", "bookkeeping", "fine-tuning length (updates, tuned)",
           "pretrained model's fine-tuning length chosen on validation", "steps", False, logged_by=FINETUNE),
    *_chosen("probe_", "pretrained"), *_chosen("random_probe_", "random init"),
    *_chosen("pixel_probe_", "raw pixels"),
    Metric("probe_train_size", "bookkeeping", "training split (images)", "training split size", "images", False,
           logged_by=FROZEN),
    Metric("probe_val_size", "bookkeeping", "validation split (images, inside training)",
           "validation split size", "images", False, logged_by=FROZEN),
    Metric("probe_test_size", "bookkeeping", "test split (images)", "test split size", "images", False,
           logged_by=FROZEN),
    Metric("data_train_test_duplicates", "bookkeeping", "test images equal to a training image",
           "number of test images byte-equal to a training image", "images", True),  # every evaluation
    Metric("train_loss", "bookkeeping", "training loss", "training loss", "target", True),
    # Online evaluation (eval.every; evaluation.online): histories with step = update, on fixed
    # small subsets, so not the final probes' or risks' numbers (bookkeeping: never a finding).
    Metric("online_knn_acc", "bookkeeping", "online kNN accuracy",
           "kNN accuracy during training (fixed validation subset, k=20)", "fraction", False),
    Metric("online_mae_risk", "bookkeeping", "online masked MSE",
           "masked risk during training (fixed test subset and masks)", "target", True),
    Metric("train_seconds", "bookkeeping", "training time (s)", "training time", "s", True),
    # Compute (mae_core.compute): pretrain_seconds is train_seconds under the name the compute
    # columns share (both kept: older stores have train_seconds only).
    Metric("model_parameters", "bookkeeping", "trainable parameters (pretraining model)",
           "trainable parameters of the pretraining model (encoder and decoder)", "parameters", True),
    Metric("flops_per_update", "bookkeeping", "FLOPs per update (forward + backward)",
           "FLOPs of one training update, forward and backward (torch's FlopCounterMode)", "FLOPs", True),
    Metric("updates_per_second", "bookkeeping", "training updates per second",
           "training updates per second of wall time", "updates/s", False),
    Metric("pretrain_seconds", "bookkeeping", "pretraining time (s)", "pretraining wall time", "s", True),
    Metric("eval_seconds", "bookkeeping", "evaluation time (s)",
           "in-trial evaluation wall time (risks, probes, baselines, fine-tuning)", "s", True),
)})  # the effective mask ratio (M-k)/M is a param (Config.resolved()), not a metric


def _plugin_rows() -> Iterator[Metric]:
    """The rows the registered plugin evaluators declare that the fixed table lacks."""
    from mae_core.registry import evaluators

    for entry in evaluators.snapshot().values():
        yield from (m for m in entry.metrics if not dict.__contains__(METRICS, m.name))


def all_rows() -> list[Metric]:
    """The table's fixed rows, then the rows the registered plugin evaluators declare
    (``@evaluator(name, metrics=[Metric(...)])``, :mod:`evaluation.evaluators`)."""
    return [*METRICS.values(), *_plugin_rows()]


def _plugin_row(name: str) -> Metric | None:
    return next((row for row in _plugin_rows() if row.name == name), None)


def names(kind: str) -> tuple[str, ...]:
    """The metrics of one kind, in the table's order."""
    return tuple(m.name for m in METRICS.values() if m.kind == kind)


RISK_METRICS = names("risk")  # the spec's risks only: what reports correlate with probes
DIAGNOSTIC_METRICS = names("diagnostic")
DOWNSTREAM_METRICS = names("downstream")
REFERENCE_METRICS = names("reference")
# The online evaluation's histories (eval.every; evaluation.online), step = update
ONLINE_METRICS = ("online_knn_acc", "online_mae_risk")
# What a trial's pretraining and evaluation cost (mae_core.compute; bookkeeping rows above)
COMPUTE_METRICS = ("model_parameters", "flops_per_update", "updates_per_second", "pretrain_seconds",
                   "eval_seconds")

# Config axes that change what a risk measures, and what they change.
RISK_MEANING_AXES: dict[str, str] = {
    "mask_ratio": "the number of visible patches k", "target": "the target space",
    "objective": "which risk is defined", "corruption": "the corruption law",
    "corruption_level": "the corruption law", "dataset": "the images",
    "patch_size": "the patch grid (M and q)",
}
