"""A search study's report: its sampled configs ranked within each arm of the grid.

A search (``mae-study run --search``) runs every sampled config once per seed, so a sampled
config is a cell: the ranking reads the mean of the search's metric over its finished seeds
(the same mean the Optuna search was told), best first within each arm. Paired claims between
arms are left to a grid study run at each arm's chosen values.
"""

from __future__ import annotations

import pandas as pd
import yaml

RANK_COLUMNS = ["rank", "n", "n_failed", "mean", "sd", "best_in_arm"]


def search_ranking(frame: pd.DataFrame, arms: list[str], searched: list[str], metric: str,
                   mode: str) -> pd.DataFrame:
    """A row per (arm, sampled config): the arm's keys, the searched keys, then ``rank`` (1 =
    best within the arm), ``n`` finished seeds, ``n_failed`` other runs, ``mean`` and ``sd`` of
    ``metric`` over the finished seeds, and ``best_in_arm``. Sorted by arm, then
    best first (``mode`` is ``min`` or ``max``); configs with no finished seed come last."""
    by = [*arms, *searched]
    rows = []
    for values, group in frame.groupby(by, dropna=False, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        finished = group[group["status"] == "FINISHED"]
        scores = finished[metric].dropna() if metric in finished else pd.Series(dtype=float)
        rows.append({**dict(zip(by, values)), "n": len(scores), "n_failed": len(group) - len(scores),
                     "mean": scores.mean() if len(scores) else float("nan"),
                     "sd": scores.std(ddof=1) if len(scores) > 1 else float("nan")})
    table = pd.DataFrame(rows, columns=[*by, "n", "n_failed", "mean", "sd"])
    key = table["mean"] if mode == "min" else -table["mean"]
    table = table.assign(_key=key).sort_values([*arms, "_key"], kind="stable", na_position="last")
    table["rank"] = (table.groupby(arms, sort=False).cumcount() + 1) if arms else range(1, len(table) + 1)
    table["best_in_arm"] = (table["rank"] == 1) & table["mean"].notna()
    return table.drop(columns="_key")[[*by, *RANK_COLUMNS]].reset_index(drop=True)


def chosen_zip(ranking: pd.DataFrame, arms: list[str], searched: list[str]) -> str:
    """A study file's ``zip:`` pairing every arm with its best sampled values, for the grid that
    compares the arms at their tuned values ("" when no arm has a finished sample)."""
    best = ranking[ranking["best_in_arm"]]
    if best.empty:
        return ""
    group = {key: [_plain(v) for v in best[key]] for key in [*arms, *searched]}
    return yaml.safe_dump({"zip": group}, default_flow_style=None, sort_keys=False).strip()


def _plain(value):
    """numpy scalars as Python numbers (yaml writes them plainly); floats to 4 significant digits."""
    value = value.item() if hasattr(value, "item") else value
    return float(f"{value:.4g}") if isinstance(value, float) else value
