"""Cells of a grid of config values: compared as ``Config`` holds them, and the grid's default
reference cell. Shared by the studies (which build grids) and the analysis (which reads them
back from MLflow), so it lives in the engine, below both.
"""

from __future__ import annotations

import itertools
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
    values.update(config.eval.flat())
    return values


Zipped = tuple[dict[str, list[Any]], ...]  # groups of keys that vary together, row by row


def zip_rows(group: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The rows of one zipped group: ``{a: [1, 2], b: [3, 4]}`` -> ``[{a: 1, b: 3}, {a: 2, b: 4}]``."""
    return [dict(zip(group, values)) for values in zip(*group.values())]


def grid_cells(axes: dict[str, list[Any]], zipped: Zipped = ()) -> list[dict[str, Any]]:
    """Every cell of a grid, in grid order: the full factorial of ``axes`` times one row of each
    zipped group (the first axis varies slowest, as :func:`itertools.product` orders it)."""
    factors = [[{key: value} for value in values] for key, values in axes.items()]
    factors += [zip_rows(group) for group in zipped]
    return [{k: v for part in parts for k, v in part.items()} for parts in itertools.product(*factors)]


def _same(key: str, a: Any, b: Any) -> bool:
    return typed_value(key, a) == typed_value(key, b)


def find_cell(cell: dict[str, Any], axes: dict[str, list[Any]], zipped: Zipped = ()) -> dict[str, Any] | None:
    """The grid cell of ``axes`` and ``zipped`` (its values as the grid spells them) equal to
    ``cell`` on every key, compared as typed config values; None if ``cell`` is not one of its
    cells (a zipped group matches only a whole row)."""
    if set(cell) != set(axes).union(*zipped):
        return None
    found = {}
    for key, values in axes.items():
        match = [v for v in values if _same(key, v, cell[key])]
        if not match:
            return None
        found[key] = match[0]
    for group in zipped:
        rows = [row for row in zip_rows(group) if all(_same(k, v, cell[k]) for k, v in row.items())]
        if not rows:
            return None
        found.update(rows[0])
    return found


def default_reference(axes: dict[str, list[Any]], zipped: Zipped = ()) -> dict[str, Any]:
    """The documented default reference cell of a grid: the cell whose every axis value equals
    the Config default of that key, else the first cell (each axis's first value, each zipped
    group's first row). ``seed``, a replicate rather than an axis, is left out."""
    axes = {k: v for k, v in axes.items() if k != "seed"}
    keys = set(axes).union(*zipped)
    if not keys:
        return {}
    defaults = config_defaults()
    at_defaults = find_cell({k: defaults.get(k, object()) for k in keys}, axes, zipped)
    return at_defaults if at_defaults is not None else grid_cells(
        {k: v[:1] for k, v in axes.items()}, tuple({k: v[:1] for k, v in g.items()} for g in zipped))[0]
