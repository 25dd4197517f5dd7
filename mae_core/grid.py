"""Cells of a grid of config values: compared as ``Config`` holds them, and the grid's default
reference cell. Shared by the studies (which build grids) and the analysis (which reads them
back from MLflow), so it lives in the engine, below both.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from .config import EVAL_PREFIX, Config, EvalConfig


def typed_value(key: str, value: Any) -> Any:
    """``value`` as the config field ``key`` holds it ("0.75" -> 0.75, "True" -> True);
    unchanged where the key is not a config field or the value does not validate."""
    name = key.removeprefix(f"{EVAL_PREFIX}.")
    fields = EvalConfig.model_fields if key.startswith(f"{EVAL_PREFIX}.") else Config.model_fields
    if name not in fields:
        return value
    try:
        return TypeAdapter(fields[name].annotation).validate_python(value)
    except ValidationError:
        return value


def config_defaults() -> dict[str, Any]:
    """Every config key's declared default (``eval.*`` keys flattened), unresolved."""
    config = Config()
    values = config.model_dump(exclude={EVAL_PREFIX})
    values.update({f"{EVAL_PREFIX}.{k}": v for k, v in config.eval.model_dump().items()})
    return values


def find_cell(cell: dict[str, Any], axes: dict[str, list[Any]]) -> dict[str, Any] | None:
    """The grid cell of ``axes`` (its values as ``axes`` spells them) equal to ``cell`` on
    every axis, compared as typed config values; None if ``cell`` is not one of its cells."""
    if set(cell) != set(axes):
        return None
    found = {}
    for key, values in axes.items():
        match = [v for v in values if typed_value(key, v) == typed_value(key, cell[key])]
        if not match:
            return None
        found[key] = match[0]
    return found


def default_reference(axes: dict[str, list[Any]]) -> dict[str, Any]:
    """The documented default reference cell of a grid: the cell whose every axis value equals
    the Config default of that key, else the first cell (each axis's first value). ``seed``, a
    replicate rather than an axis, is left out."""
    axes = {k: v for k, v in axes.items() if k != "seed"}
    defaults = config_defaults()
    at_defaults = find_cell({k: defaults.get(k, object()) for k in axes}, axes) if axes else {}
    return at_defaults if at_defaults is not None else {k: v[0] for k, v in axes.items()}
