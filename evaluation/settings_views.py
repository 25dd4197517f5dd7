"""What a built-in evaluator's class is made of: its rows of the metric table and its view of
the ``eval.<key>`` keys that predate evaluators with settings. Imports no torch."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, create_model

from mae_core.config import EvalConfig

from .metrics import METRICS, Metric


def rows_logged_by(name: str) -> tuple[Metric, ...]:
    """The metric table's rows that evaluator ``name`` logs (their ``logged_by``)."""
    return tuple(m for m in METRICS.values() if m.logged_by == name)


def view_of(name: str, keys: tuple[str, ...]):
    """A ``Settings`` model of ``keys`` of :class:`~mae_core.config.EvalConfig` (same types,
    defaults and descriptions): a built-in's view of its flat ``eval.<key>`` keys."""
    fields: dict[str, Any] = {key: (EvalConfig.model_fields[key].annotation, EvalConfig.model_fields[key])
                              for key in keys}
    return create_model(name, __config__=ConfigDict(extra="forbid", frozen=True), **fields)
