"""The one table of what a trial logs: every metric's name, label, unit, direction and reference.

Progress lines, the report's frame, figures, statistics and tables all read this table, so a
metric is named and described once. ``RISK_MEANING_AXES`` lists the config axes across which a
risk is not the same quantity (a "best risk" or a risk-vs-quality correlation across such cells
compares unlike numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

ACCURACY = "accuracy (test split)"


@dataclass(frozen=True)
class Metric:
    name: str  # the MLflow metric name
    kind: str  # risk | baseline | downstream | reference | bookkeeping
    label: str  # for an axis: what it is
    plain: str  # for a sentence
    unit: str  # "fraction" (accuracies), "target" (squared error in target units), "s", ...
    lower_is_better: bool
    reference: str | None = None  # the metric it is read against (random init, mean pixel)
    reference_name: str | None = None  # how that reference is called in a legend


def _risk(name: str, label: str, plain: str) -> Metric:
    return Metric(name, "risk", label, plain, "target", True, "test_baseline_risk")


def _probe(name: str, what: str, plain: str, reference: str | None) -> Metric:
    return Metric(name, "downstream", f"{what} {ACCURACY}", plain, "fraction", False, reference)


def _random(name: str, plain: str, reference_name: str | None = None) -> Metric:
    return Metric(name, "reference", f"{plain} (random init)", f"{plain} of a random-init encoder",
                  "fraction", False, reference_name=reference_name)


METRICS: dict[str, Metric] = {m.name: m for m in (
    _risk("test_mae_risk", "masked MSE", "masked risk"),
    _risk("test_rec_risk", "reconstruction MSE", "reconstruction risk"),
    _risk("test_den_risk", "denoising MSE", "denoising risk"),
    Metric("test_mae_risk_stderr", "bookkeeping", "masked MSE standard error",
           "standard error of the masked risk", "target", True),
    Metric("test_baseline_risk", "baseline", "mean-pixel baseline MSE", "mean-pixel baseline risk",
           "target", True, reference_name="mean-pixel baseline"),
    _probe("probe_linear_acc", "linear probe", "linear-probe accuracy", "random_probe_linear_acc"),
    _probe("probe_fewshot_acc", "few-shot probe", "few-shot probe accuracy", "random_probe_fewshot_acc"),
    _probe("probe_knn_acc", "kNN", "kNN accuracy", "random_probe_knn_acc"),
    _probe("finetune_acc", "fine-tuning", "fine-tuning accuracy", "random_finetune_acc"),
    _probe("partial_finetune_acc", "partial fine-tuning", "partial fine-tuning accuracy", None),
    _random("random_probe_linear_acc", "linear-probe accuracy"),
    _random("random_probe_fewshot_acc", "few-shot probe accuracy"),
    _random("random_probe_knn_acc", "kNN accuracy"),
    _random("random_finetune_acc", "fine-tuning accuracy", reference_name="from scratch"),
    Metric("train_loss", "bookkeeping", "training loss", "training loss", "target", True),
    Metric("train_seconds", "bookkeeping", "training time (s)", "training time", "s", True),
)}  # the effective mask ratio (M-k)/M is a param (Config.resolved()), not a metric


def names(kind: str) -> tuple[str, ...]:
    """The metrics of one kind, in the table's order."""
    return tuple(m.name for m in METRICS.values() if m.kind == kind)


RISK_METRICS = names("risk")
DOWNSTREAM_METRICS = names("downstream")
REFERENCE_METRICS = names("reference")

# Config axes that change what a risk measures, and what they change.
RISK_MEANING_AXES: dict[str, str] = {
    "mask_ratio": "the number of visible patches k", "target": "the target space",
    "objective": "which risk is defined", "corruption": "the corruption law",
    "corruption_level": "the corruption law", "dataset": "the images",
    "patch_size": "the patch grid (M and q)",
}
