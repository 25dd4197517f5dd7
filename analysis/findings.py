"""A report's exploratory findings: every row against the study's reference row and against the
baselines measured in the same runs, in the declared claims' four words (better, worse,
equivalent, inconclusive) marked "exploratory, outside the family"; for a search, its sampled
configs ranked within each arm.

The reference row is the parent run's ``reference`` tag; without one, the documented default of
:func:`mae_core.grid.default_reference`. Files: ``comparisons.csv`` (or ``search.csv``),
``baselines.csv`` and ``findings.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from evaluation.metrics import METRICS, RISK_MEANING_AXES
from mae_core.grid import default_reference

from .trials_frame import DOWNSTREAM_METRICS, RISK_METRICS, cast_param
from .markdown import markdown_table
from .search import chosen_zip, search_ranking
from .stats import ALPHA, EXPLORATORY, POWER, baseline_comparisons, paired_comparisons, verdict
from .tables import present


def cell_text(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "all"


def _typed_cell(cell: dict) -> dict:
    """Axis values as the frame holds them (JSON tags and CLI overrides may spell them as text)."""
    return {key: cast_param(key, str(value)) for key, value in cell.items()}


def study_reference(info: dict, frame: pd.DataFrame, axes: Sequence[str]) -> tuple[dict, bool]:
    """(the reference cell, whether the study named it): the parent's ``reference`` tag when it
    names every axis, else :func:`mae_core.grid.default_reference` of the grid (the parent's
    ``grid`` and ``zip`` tags, or the axis values in the frame)."""
    tagged = info.get("reference")
    if isinstance(tagged, dict) and set(tagged) == set(axes):
        return _typed_cell(tagged), True
    zipped = tuple(g for g in info.get("zip") or () if set(g) <= set(axes))  # keys that vary together
    factorial = [a for a in axes if not any(a in g for g in zipped)]
    grid = {a: v for a, v in (info.get("grid") or {}).items() if a in factorial and isinstance(v, list) and v}
    if set(grid) != set(factorial):
        grid = {a: list(pd.unique(frame[a])) for a in factorial}
    return _typed_cell(default_reference(grid, zipped)), False


@dataclass
class Findings:
    reference: dict  # the reference cell
    named: bool  # the study named it (parent tag), or it is the documented default
    comparisons: pd.DataFrame  # paired_comparisons + claim and verdict columns
    display: pd.DataFrame  # the same as text, for the page and findings.md
    text: str  # the paragraph above the table
    baselines: pd.DataFrame = field(default_factory=pd.DataFrame)  # each row against each baseline, as text


def _comparison_metrics(frame: pd.DataFrame, axes: Sequence[str]) -> list[str]:
    """Downstream accuracies always; risks only when no axis changes what the risk measures
    (otherwise a lower risk could mean an easier task, not a better model)."""
    finished = frame[frame["status"] == "FINISHED"]
    metrics = present(finished, DOWNSTREAM_METRICS)
    if not any(a in RISK_MEANING_AXES for a in axes):  # axes that change what a risk measures
        metrics = present(finished, RISK_METRICS) + metrics
    return metrics


def _number(value: float, fmt: str) -> str:
    return "—" if value != value else format(value, fmt)


def _interval(row) -> str:
    """A comparison row's 95% interval as text; a dash when there is none."""
    return "—" if row["ci_low"] != row["ci_low"] else f"[{row['ci_low']:+.3g}, {row['ci_high']:+.3g}]"


def _findings_display(comparisons: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    rows = []
    for _, row in comparisons.iterrows():
        interval = _interval(row)
        rows.append({"row": cell_text({a: row[a] for a in axes}), "metric": row["metric"],
                     "better is": row["claim"], "n": int(row["n"]),
                     "difference (row − reference)": _number(row["mean_diff"], "+.3g"),
                     "95% CI": interval, "adjusted p": _number(row["p_holm"], ".2g"),
                     "±delta": _number(row["delta"], "g"), "verdict": row["verdict"],
                     "smallest detectable": _number(row["detectable_diff"], ".2g")})
    return pd.DataFrame(rows, columns=["row", "metric", "better is", "n", "difference (row − reference)",
                                       "95% CI", "adjusted p", "±delta", "verdict", "smallest detectable"])


def _baseline_pairs(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(downstream metric, a baseline it is read against) for every logged downstream accuracy:
    its random-init reference, then its further baselines (raw pixels, tuned from scratch)."""
    finished = frame[frame["status"] == "FINISHED"]
    return [(m, b) for m in present(finished, DOWNSTREAM_METRICS)
            for b in (METRICS[m].reference, *METRICS[m].baselines) if b is not None and b in finished]


def _baseline_name(metric: str) -> str:
    return METRICS[metric].reference_name or ("random init" if metric.startswith("random_") else metric)


POOLED = "— (pooled over looks: not a decision)"
BASELINES_TEXT = ("Each row's accuracy against the baselines measured in the same runs (random-init encoder, "
                  "raw pixels, training from scratch for as many updates, and for the length best on "
                  "validation), paired within each run, i.e. by seed; better means above the baseline. The "
                  "difference tests and TOSTs of the rows of each (metric, baseline) pair are adjusted as one "
                  f"family; verdicts as above, {EXPLORATORY}.")


def _baseline_findings(frame: pd.DataFrame, axes: list[str], out: Path,
                       pooled: bool = False) -> tuple[pd.DataFrame, Path | None]:
    """``baselines.csv`` (every cell against each baseline, paired within each run) and the same
    as text for ``findings.md`` and the page; an empty table and no file when no trial logged a
    baseline."""
    table = baseline_comparisons(frame, axes, _baseline_pairs(frame))
    if not len(table):
        return pd.DataFrame(), None
    table["claim"] = "higher"
    table["verdict"] = [verdict(row, "higher") for _, row in table.iterrows()]
    if pooled:
        table["verdict"] = POOLED
    path = out / "baselines.csv"
    table.to_csv(path, index=False)
    rows = [{"row": cell_text({a: row[a] for a in axes}) if axes else "every trial", "metric": row["metric"],
             "against": _baseline_name(row["baseline"]), "n": int(row["n"]),
             "difference (row − baseline)": _number(row["mean_diff"], "+.3g"),
             "95% CI": _interval(row),
             "adjusted p": _number(row["p_holm"], ".2g"), "verdict": row["verdict"]} for _, row in table.iterrows()]
    return pd.DataFrame(rows), path


def write_findings(frame: pd.DataFrame, study: str, axes: list[str], info: dict,
                    out: Path) -> tuple[Findings, list[Path]]:
    """``comparisons.csv`` (every number of :func:`~analysis.stats.paired_comparisons`, with
    the claim and the verdict) and ``findings.md`` (the verdicts in words)."""
    reference, named = study_reference(info, frame, axes)
    comparisons = paired_comparisons(frame, axes, reference, _comparison_metrics(frame, axes))
    comparisons["claim"] = ["lower" if METRICS[m].lower_is_better else "higher" for m in comparisons["metric"]]
    comparisons["verdict"] = [verdict(row, row["claim"]) for _, row in comparisons.iterrows()]
    pooled = bool((info.get("sequential") or {}).get("looks"))  # seeds by need: no fixed-n decision here
    if pooled:
        comparisons["verdict"] = POOLED
    display = _findings_display(comparisons, axes)
    source = ("named by the study (its run's reference tag)" if named else
              "the documented default (the cell at the Config defaults, else the grid's first cell)")
    text = (f"Exploratory comparisons, outside the family: not the study's declared claims (those are "
            f"decided above, in claims.csv, as one family at α = {ALPHA}). Every row against the reference, "
            f"per metric. Reference row: {cell_text(reference)}, {source}. Each row is compared with it "
            f"on every downstream accuracy (and on the risks when no axis changes what a risk measures), "
            f"paired by seed: the difference is row − reference over the seeds both finished, with a 95% "
            f"t-interval (not adjusted). The verdicts use the claims' four words, each {EXPLORATORY}: the "
            f"paired t-test and the TOST within the metric's ±delta of the rows of each metric are adjusted "
            f"together as one family (the claims' rule) and compared with {ALPHA}; better or worse in the "
            f"metric's better sense (higher accuracy, lower risk), equivalent (the TOST), inconclusive "
            f"otherwise, which is not evidence of no effect (the last column: the smallest difference "
            f"those pairs would detect with {POWER:.0%} power at the observed spread). Being outside the family, "
            f"these verdicts add to its error rate: read them as leads for the next declared claim.")
    if pooled:
        text += (" This run added seeds by need, so its pooled p-values ignore the looks that chose them "
                 "and are not decisions: no verdict is given here (the claims above are decided look "
                 "by look).")
    if not axes:
        text = "The study has a single cell, so no row is compared with a reference."
    elif not len(comparisons):
        text += " No finished trial logged a metric to compare, so nothing is claimed."
    elif not (comparisons["n"] > 0).any():
        text += " The reference row has no finished trial paired with another row, so nothing is claimed."
    if info.get("smoke"):
        text = ("Smoke run: a few dozen updates on a few hundred images, to exercise the code; "
                "whatever the verdicts say, they are not findings of the study. ") + text
    paths = [out / "comparisons.csv", out / "findings.md"]
    comparisons.to_csv(paths[0], index=False)
    baselines, baselines_csv = _baseline_findings(frame, axes, out, pooled)
    paths += [baselines_csv] if baselines_csv is not None else []
    against = f"## Against the baselines\n\n{BASELINES_TEXT}\n\n{markdown_table(baselines)}" if len(baselines) else ""
    title = f"{study}{' (smoke run)' if info.get('smoke') else ''}: findings"
    paths[1].write_text(f"# {title}\n\n{text}\n\n{markdown_table(display) if len(display) else ''}"
                        f"\n\n{against}", encoding="utf-8")
    return Findings(reference, named, comparisons, display, text, baselines), paths


def write_search_findings(frame: pd.DataFrame, study: str, axes: list[str], info: dict,
                           out: Path) -> tuple[Findings, list[Path]]:
    """A search's findings: ``search.csv`` (every sampled config ranked within its arm by the
    search's metric, mean over seeds) and ``findings.md`` (the ranking in words, with a
    ``zip:`` that pairs each arm with its best values). A search makes no paired claims."""
    search = info["search"]
    metric, mode = search.get("metric", "probe_linear_acc"), search.get("mode", "max")
    searched = [k for k in search.get("space", {}) if k in frame]
    arms = [a for a in axes if a not in searched]
    ranking = search_ranking(frame, arms, searched, metric, mode)
    display = ranking.assign(mean=[_number(v, ".4g") for v in ranking["mean"]],
                             sd=[_number(v, ".2g") for v in ranking["sd"]])
    space = ", ".join(f"{k}={v}" for k, v in search.get("space", {}).items())
    text = (f"A {search.get('algorithm', '')} search of {space}: {search.get('samples', '?')} sampled configs "
            f"per arm{' (' + ', '.join(arms) + ')' if arms else ''}, each run once per seed, ranked within "
            f"its arm by the mean of {metric} over its finished seeds ({'lower' if mode == 'min' else 'higher'} "
            f"is better). {metric} is measured on the test split, so the best value of each arm is an "
            f"optimistic estimate (it was chosen on the data it is reported on). A search makes no paired "
            f"claims: compare the arms at their chosen values in a grid study, whose report pairs them by seed.")
    if info.get("smoke"):
        text = "Smoke run: a few dozen updates, to exercise the code; the ranking is not a finding. " + text
    suggestion = chosen_zip(ranking, arms, searched)
    paths = [out / "search.csv", out / "findings.md"]
    ranking.to_csv(paths[0], index=False)
    snippet = (f"\n\nEach arm at its best sampled values, as a study file's grid:\n\n```yaml\n{suggestion}\n```"
               if suggestion else "")
    paths[1].write_text(f"# {study}{' (smoke run)' if info.get('smoke') else ''}: search\n\n{text}\n\n"
                        f"{markdown_table(display)}{snippet}\n", encoding="utf-8")
    return Findings({}, False, ranking, display, text), paths
