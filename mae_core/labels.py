"""The rules a dataset's labels are held to, before anything is sized by them.

Where a reader numbers the classes from the labels themselves (an npz without ``class_names``,
a plugin's ``@dataset_format``), the class names are ``range(largest label + 1)`` and the
probes' output layers as wide: one label of 2³¹-1 in a tiny file would take gigabytes. So a
label must be an integer in ``[0, MAX_CLASSES)``, checked on the label values alone.

A training split of a single class leaves the probes nothing to separate: every probe scores a
perfect, meaningless accuracy (the constant rule). Training with the probes refuses it.
"""

from __future__ import annotations

import numpy as np

from .errors import UserError

# At most this many classes: ImageNet-1k's 1,000 and CIFAR-100's 100 with room to spare; a label
# above is a damaged file or a mistake (and one class-number of 2**31-1 is gigabytes of names).
MAX_CLASSES = 10_000


class LabelError(UserError):
    """Labels out of range, or too few classes for the probes (one line naming the data)."""


def require_label_range(labels: np.ndarray, where: str) -> None:
    """Every label of ``labels`` int ``[N]`` lies in ``[0, MAX_CLASSES)``; reads only the values."""
    if not len(labels):
        return
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= MAX_CLASSES:
        raise LabelError(f"{where}: labels must be class numbers in [0, {MAX_CLASSES}) (at most "
                         f"{MAX_CLASSES:,} classes), got {low if low < 0 else high}")


def numbered_class_names(labels: np.ndarray, where: str) -> tuple[str, ...]:
    """``("0", ..., str(largest label))`` for labels int ``[N]`` (N >= 1), once their range is checked."""
    require_label_range(labels, where)
    return tuple(str(i) for i in range(int(labels.max()) + 1))


def require_two_classes(labels, what: str) -> None:
    """``labels`` int ``[N]`` (numpy or torch) hold at least two distinct classes, as the probes
    need; ``what`` names the split (e.g. ``the training split of dataset=npz:d.npz``)."""
    distinct = np.unique(np.asarray(labels))
    if len(distinct) < 2:
        held = f"one class (label {distinct[0]})" if len(distinct) else "no labels"
        raise LabelError(f"{what} holds {held}; the probes (eval.evaluators lists probes) need two classes "
                         "or more: give data with two labels or more, or set eval.evaluators=risks")
