"""Words for a paper: what an axis is called, how its values read, what a metric's column is.

One small table each, read by the figures, the paper tables and the report page, so a value
reads the same everywhere (``mask_token_in_encoder=False`` is "not in encoder" on an axis, in a
legend and in Table 1c alike). Config keys and values stay the names in run names and CSVs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evaluation.metrics import METRICS, all_rows
from mae_core import registry

# Axis titles with their unit (figures).
AXIS_LABELS = {
    "mask_ratio": "mask ratio ρ (effective)", "effective_mask_ratio": "mask ratio ρ (effective)",
    "decoder_depth": "decoder depth (blocks)", "decoder_width": "decoder width (channels)",
    "encoder_depth": "encoder depth (blocks)", "encoder_width": "encoder width (channels)",
    "steps": "pretraining length (updates)", "target": "reconstruction target",
    "mask_sampling": "mask sampling", "mask_token_in_encoder": "mask token",
    "objective": "objective", "corruption": "corruption", "corruption_level": "corruption level",
    "lr": "base learning rate (per 256 images)", "batch_size": "batch size (images)",
    "eval.finetune_blocks": "blocks fine-tuned (last n; all: every weight)",
}

# Sub-table titles, as MAE Table 1 names its parts: (a) decoder depth, (c) mask token, ...
SETTING_NAMES = {
    "mask_ratio": "mask ratio", "effective_mask_ratio": "mask ratio", "decoder_depth": "decoder depth",
    "decoder_width": "decoder width", "encoder_depth": "encoder depth", "encoder_width": "encoder width",
    "steps": "pretraining length", "target": "reconstruction target", "mask_sampling": "mask sampling",
    "mask_token_in_encoder": "mask token", "objective": "objective", "corruption": "corruption",
    "corruption_level": "corruption level", "lr": "learning rate", "batch_size": "batch size",
}

# The first column's head in a table, as MAE Table 1 writes it (its sub-caption names the setting).
TABLE_HEADS = {
    "decoder_depth": "blocks", "encoder_depth": "blocks", "decoder_width": "dim", "encoder_width": "dim",
    "mask_ratio": "ratio", "effective_mask_ratio": "ratio", "steps": "updates", "target": "case",
    "mask_sampling": "case", "mask_token_in_encoder": "case", "objective": "case",
}

# Values that read badly as Python: the config's booleans (MAE Table 1c's words).
VALUE_LABELS: dict[str, dict[Any, str]] = {
    "mask_token_in_encoder": {False: "not in encoder", True: "in encoder"},
    "class_token": {False: "avg. pool", True: "class token"},
}
# The parts whose values are registry names: each reads as its entry's ``label`` (MAE Table 1d's
# "pixel (w/ norm)", a plugin's own), so a name is labelled where it is registered, and only there.
PART_REGISTRIES = {"objective": registry.objectives, "target": registry.targets, "corruption": registry.corruptions}


def value_labels(axis: str | None) -> dict[Any, str]:
    """The words for ``axis``'s values: the table above, or a registered part's names -> labels
    (read at each call: a plugin's parts are registered after import)."""
    parts = PART_REGISTRIES.get(axis or "")
    if parts is None:
        return VALUE_LABELS.get(axis or "", {})
    return {name: entry.label or name for name, entry in parts.snapshot().items()}


# Table 1's columns and baseline rows are read from the metric table at each call, never kept as
# constants, so a plugin evaluator's rows registered after import appear too.
def table_columns() -> dict[str, str]:
    """MAE Table 1's accuracy columns (metric -> short head), from the metric table's
    ``column`` (a plugin evaluator's rows included), in their ``column_rank`` order."""
    rows = sorted((m for m in all_rows() if m.column), key=lambda m: m.column_rank)
    return {m.name: m.column for m in rows}


def baseline_rows() -> dict[str, dict[str, str]]:
    """The baseline rows under that table: row name (a reference's ``table_row``) -> {column
    metric: the reference metric that fills it}, rows in the metric table's order."""
    columns = [METRICS[name] for name in table_columns()]
    names = list(dict.fromkeys(m.table_row for m in all_rows() if m.table_row))
    rows = {name: {c.name: ref for c in columns for ref in (c.reference, *c.baselines)
                   if ref is not None and METRICS[ref].table_row == name} for name in names}
    return {name: fills for name, fills in rows.items() if fills}


def axis_label(axis: str) -> str:
    """An axis title with its unit: ``decoder_depth`` -> "decoder depth (blocks)"."""
    return AXIS_LABELS.get(axis, axis.replace("_", " "))


def setting_name(axis: str) -> str:
    """A sub-table title without unit: ``mask_token_in_encoder`` -> "mask token"."""
    return SETTING_NAMES.get(axis, axis.replace("_", " "))


def table_head(axes) -> str:
    """The head of a table's setting column: MAE's word for one axis, the names for several."""
    axes = list(axes)
    return TABLE_HEADS.get(axes[0], setting_name(axes[0])) if len(axes) == 1 else ", ".join(map(setting_name, axes))


def value_text(axis: str | None, value: Any) -> str:
    """An axis value as a reader sees it: :func:`value_labels`, else booleans as yes/no, missing as
    "none", floats in their shortest form (0.75, 1e-05), anything else as text."""
    if isinstance(value, np.generic):  # a frame's numpy.bool_ / int64 reads as the Python value
        value = value.item()
    if value is None or (isinstance(value, float) and value != value):
        return value_labels(axis).get(None, "none")
    for key, text in value_labels(axis).items():
        if key == value and type(key) is type(value):  # 1 is not True, 1.0 not 1
            return text
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, "g")
    return str(value)


def is_accuracy(metric: str) -> bool:
    """Accuracies are logged as fractions and shown in % (MAE Table 1, Figure 5)."""
    known = METRICS.get(metric)
    return known is not None and known.unit == "fraction"
