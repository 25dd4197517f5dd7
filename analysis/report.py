"""One study's report: tables, correlations, figures and a self-contained ``index.html``.

Reads only the MLflow store (``analysis.frame``), so a report never needs the Ray results
folder. Every number is mean ± sd over seeds with n stated (accuracies also with the test set's
binomial standard error); failed cells stay in every table, marked with their reason.

What a report claims comes from ``analysis.stats`` alone: every row against the study's
reference row (the parent run's ``reference`` tag; without one, the documented default of
:func:`mae_core.grid.default_reference`), paired by seed, in the declared claims' four words
(better, worse, equivalent, inconclusive) marked "exploratory, outside the family"; and rank
correlations only among trials whose risk is
the same quantity. A smoke run (parent tag ``smoke`` = "True") claims no correlation and says
so in its title.

Files written to ``out_dir``: ``trials.csv`` (a row per trial: every param and final metric, so
anyone can recompute every number) with ``study.json`` (the study's header: axes, grid,
reference, paper; :mod:`analysis.trials_file` reads the two back), ``findings.md``, ``comparisons.csv``, ``paper_table.tex``
(the study in MAE Table 1's form), ``summary.{csv,md,tex}`` (every metric by cell),
``correlations.{csv,md}``, for a search ``search.csv`` (its sampled configs ranked within
each arm, in place of ``comparisons.csv``), ``fig_<what>.<fmt>`` (full text width, 7 in) and
``fig_<what>_column.<fmt>`` (one column, 3.3 in) for each requested format,
``fig_reconstructions_<cell>.{png,pdf}`` when the trials logged reconstruction grids,
``fig_online`` (each online metric against update, one line per cell) when trials logged the
``eval.every`` histories, and
``index.html`` (:mod:`analysis.page`; PNGs embedded as data URIs). Figure captions name the
study's ``paper`` row; the figures themselves are :mod:`analysis.figures`'.
"""

from __future__ import annotations

import html
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from . import claims_report, figures, page, paper_table, variance
from mae_core.files import FolderNotWritable, writable_folder

from .frame import (
    DOWNSTREAM_METRICS,
    FINAL_METRICS,
    RISK_METRICS,
    ReportError,
    cast_param,
    load_history,
    load_runs,
    load_study_info,
)
from evaluation import reconstruction_grid
from evaluation.metrics import METRICS, ONLINE_METRICS, RISK_MEANING_AXES, all_rows, block_metric_names
from mae_core.grid import default_reference

from .search import chosen_zip, search_ranking
from .labels import value_text
from .markdown import markdown_table
from .provenance import provenance
from .trials_file import write_study_info

from .stats import (
    CORRELATION_COLUMNS,
    MIN_CLUSTERS,
    MIN_TRIALS,
    baseline_comparisons,
    EXPLORATORY,
    correlation_reading,
    paired_comparisons,
    plain_name,
    rank_correlations,
    summarise,
    verdict,
)

# Metrics in the summary table: every final metric (the effective ratio is a param, shown as a
# column of the cell itself beside the nominal ratio).
TABLE_METRICS = FINAL_METRICS


def probe_panels() -> tuple[str, ...]:
    """The probes figure's panels: the metric table's rows with ``figure="probes"`` (a plugin
    evaluator's included, hence read at each call): linear, few-shot, kNN, partial fine-tuning."""
    return tuple(m.name for m in all_rows() if m.figure == "probes")


# Axes that change what a risk measures: a risk is compared or correlated only among cells
# that agree on all of them.
RISK_CHANGING_AXES = RISK_MEANING_AXES
SMOKE_NOTE = "smoke run: no correlation claimed"


_Figure = page.Figure
CLAIMS_CAPTION = ("Each declared claim's effect (cell − reference, paired by seed) with its simultaneous interval, "
                  "in units of the claim's smallest effect of interest and oriented so that right is better; "
                  "the grey band is ±delta. Colour and word: the verdict (better, worse, equivalent within "
                  "±delta, inconclusive). In brackets after each claim: when it was declared (before: registered "
                  "when the study started; after: exploratory; unregistered: its study file was not committed).")


# --------------------------------------------------------------------------------- tables


def _fmt(mean: float, std: float, binomial: float = math.nan) -> str:
    if mean != mean:  # NaN: nothing finished in this cell
        return "—"
    text = f"{mean:.4g}" if std != std else f"{mean:.4g} ± {std:.2g}"
    return text if binomial != binomial else f"{text} (test ±{binomial:.2g})"


def _note(row: pd.Series) -> str:
    notes = []
    if row["n_failed"]:
        reason = row.get("failure_reason")
        notes.append(f"FAILED ×{row['n_failed']}" + (f": {reason}" if isinstance(reason, str) else ""))
    if row["n_incomplete"]:
        notes.append(f"not finished ×{row['n_incomplete']} (killed or running)")
    return "; ".join(notes)


def display_table(summary: pd.DataFrame, by: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """The summary as text: cell keys, ``n``, ``n_failed``, each metric as ``mean ± sd`` (with
    the test set's binomial standard error as ``(test ±se)`` where the summary has it, and its
    own n when it differs from the cell's), and a ``note`` naming failures."""
    table = summary[list(by)].astype(object).where(summary[list(by)].notna(), "None")
    table["n"] = summary["n"]
    table["n_failed"] = summary["n_failed"]
    for metric in metrics:
        cells = []
        for _, row in summary.iterrows():
            text = _fmt(row[f"{metric}_mean"], row[f"{metric}_std"], row.get(f"{metric}_binom_se", math.nan))
            own_n = row[f"{metric}_n"]
            if own_n and own_n != row["n"]:
                text += f" (n={own_n})"
            cells.append(text)
        table[metric] = cells
    table["note"] = [_note(row) for _, row in summary.iterrows()]
    return table


_LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                   "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                   "^": r"\textasciicircum{}", "±": r"$\pm$", "×": r"$\times$", "—": "--",
                   "–": "--", "ρ": r"$\rho$", "τ": r"$\tau$", "²": r"$^2$"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in str(text))


def latex_table(table: pd.DataFrame, caption: str, label: str) -> str:
    """A booktabs ``table`` environment (needs ``\\usepackage{booktabs}``)."""
    align = "".join("r" if pd.api.types.is_numeric_dtype(table[c]) else "l" for c in table.columns)
    body = [" & ".join(latex_escape(v) for v in row) + r" \\" for row in table.itertuples(index=False)]
    return "\n".join([
        r"\begin{table}[t]", r"\centering", r"\small",
        rf"\begin{{tabular}}{{{align}}}", r"\toprule",
        " & ".join(latex_escape(c) for c in table.columns) + r" \\", r"\midrule",
        *body, r"\bottomrule", r"\end{tabular}",
        rf"\caption{{{latex_escape(caption)}}}", rf"\label{{{label}}}", r"\end{table}", "",
    ])


# ------------------------------------------------------------------------------- helpers


def _writable(out_dir: Path) -> Path:
    try:
        return writable_folder(out_dir)
    except FolderNotWritable as error:
        raise ReportError(f"report folder {error}") from None


def _present(frame: pd.DataFrame, metrics: Sequence[str]) -> list[str]:
    return [m for m in metrics if m in frame and frame[m].notna().any()]


def _primary_risk(frame: pd.DataFrame, risks: Sequence[str]) -> str | None:
    """The risk logged by the most finished trials (the masked risk wins ties)."""
    finished = frame[frame["status"] == "FINISHED"]
    counts = {r: int(finished[r].notna().sum()) for r in risks}
    best = max(counts.values(), default=0)
    return next((r for r in risks if counts[r] == best), None) if best else None


def _correlation_text(correlations: pd.DataFrame, risk: str, probe: str) -> str:
    rows = correlations[(correlations["risk"] == risk) & (correlations["downstream"] == probe)]
    usable = rows.dropna(subset=["spearman_rho"])
    if usable.empty:
        n = int(rows["n"].max()) if len(rows) else 0
        reason = rows["reason"].dropna().iloc[0] if rows["reason"].notna().any() else "too few trials"
        if reason == SMOKE_NOTE:
            return "Smoke run: no rank correlation claimed"
        return (f"n ≤ {n} per stratum: no rank correlation claimed\n(at least {MIN_TRIALS} trials "
                f"whose risk is the same quantity\nand {MIN_CLUSTERS} cells when they span several)")
    r = usable.loc[usable["n"].idxmax()]
    more = f"\n(+{len(usable) - 1} more strata in correlations.csv)" if len(usable) > 1 else ""
    return (f"{r.stratum}: Spearman ρ = {r.spearman_rho:+.2f} [{r.spearman_low:+.2f}, {r.spearman_high:+.2f}]\n"
            f"Kendall τ = {r.kendall_tau:+.2f} [{r.kendall_low:+.2f}, {r.kendall_high:+.2f}]\n"
            f"n = {int(r.n)} trials in {int(r.n_clusters)} clusters, 95% cluster-bootstrap CIs{more}")


def _cell_text(values: dict) -> str:
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


def _slug(values: dict) -> str:
    text = "_".join(f"{k}-{v}" for k, v in values.items()) or "all"
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)


# ------------------------------------------------------------------------------- figures


def figure_caption(info: dict, sentence: str, frame: pd.DataFrame, by: Sequence[str]) -> str:
    """A caption: what the figure shows, n and what its marks mean, and the paper row the
    study mirrors (its ``paper``; nothing is claimed to mirror a paper when it has none)."""
    paper = info.get("paper")
    mirrors = f" Mirrors {paper}." if paper else ""
    smoke = "Smoke run, not a finding: " if info.get("smoke") else ""
    return f"{smoke}{sentence} ({figures.seed_note(frame, by)}; {figures.interval_note()}).{mirrors}"


def _figure_plan(frame: pd.DataFrame, axes: Sequence[str], correlations: pd.DataFrame,
                 risks: Sequence[str], history: pd.DataFrame,
                 info: dict, online: pd.DataFrame | None = None) -> list[tuple[str, str, Callable[[float], Figure]]]:
    """(name, caption, builder of a figure at a width in inches) of every figure this study
    gets; built one at a time later."""
    axis = axes[0] if axes else None
    hue = axes[1] if len(axes) > 1 else None
    cell = [a for a in (axis, hue) if a]
    plan: list[tuple[str, str, Callable[[float], Figure]]] = []

    def caption(sentence: str, by: Sequence[str] = cell) -> str:
        return figure_caption(info, sentence, frame, by)

    if axis:
        against = f"against {figures.axis_label(axis)}"
        if _present(frame, ["finetune_acc"]):  # MAE Figure 5's two panels; otherwise "probes" shows them
            plan.append(("probe_and_finetune", caption(f"Linear-probe and fine-tuning accuracy {against}"),
                         lambda w: figures.probe_and_finetune(frame, axis, hue=hue, width=w)))
        if risks:
            plan.append(("risks", caption(f"Test risks {against}; band: the mean-pixel baseline"),
                         lambda w: figures.metric_vs_axis(frame, axis, list(risks), hue=hue, width=w)))
        probes = _present(frame, probe_panels())
        if probes:
            plan.append(("probes", caption(f"Every probe's accuracy {against}"),
                         lambda w: figures.metric_vs_axis(frame, axis, probes, hue=hue, width=w)))
    if "objective" in axes:
        plan.append(("objectives", caption("Downstream accuracy by objective", ["objective"]),
                     lambda w: figures.objectives_comparison(frame, width=w)))
    primary = _primary_risk(frame, risks)
    if primary and _present(frame, ["probe_linear_acc"]):
        text = _correlation_text(correlations, primary, "probe_linear_acc")
        paper = f" Mirrors {info['paper']}." if info.get("paper") else ""
        plan.append(("risk_vs_probe", f"{plain_name(primary).capitalize()} against linear-probe "
                     f"accuracy, one point per finished trial; the rank correlation is printed "
                     f"below the axes.{paper}",
                     lambda w: figures.risk_vs_probe(frame, primary, "probe_linear_acc", text, hue=axis, width=w)))
    if len(history):
        plan.append(("training_curves", caption("Training loss (mean over each logging interval) per "
                                                "update; bands: 95% t-interval of the mean over seeds",
                                                [axis] if axis else []),
                     lambda w: figures.training_curves(history, frame, hue=axis, width=w)))
    if online is not None and len(online):
        plan.append(("online", caption(f"{ONLINE_CAPTION}; bands: 95% t-interval of the mean over seeds"),
                     lambda w: figures.online_curves(online, frame, cell, width=w)))
    return plan


ONLINE_CAPTION = ("Online evaluation (eval.every) per update, one line per cell: kNN accuracy (k=20) on a "
                  "fixed validation subset and, for an MAE, the masked risk on fixed test images and masks")


def load_online(tracking_uri: str, run_ids: list[str]) -> pd.DataFrame:
    """The online evaluation's histories of ``run_ids``: ``run_id, metric, step, value`` (empty
    when no run logged one)."""
    parts = [load_history(tracking_uri, run_ids, key).assign(metric=key) for key in ONLINE_METRICS]
    return pd.concat(parts, ignore_index=True)[["run_id", "metric", "step", "value"]]


def _make_figures(frame: pd.DataFrame, axes: Sequence[str], tracking_uri: str,
                  correlations: pd.DataFrame, risks: Sequence[str], out: Path,
                  formats: Sequence[str], info: dict) -> tuple[list[_Figure], list[str]]:
    """Save every planned figure at both widths in ``formats``; keep the full width's PNG for
    the page. Returns the figures and the file names written."""
    if not (frame["status"] == "FINISHED").any():
        return [], []  # nothing to plot; the tables say why
    history = load_history(tracking_uri, frame["run_id"].tolist(), "train_loss")
    online = load_online(tracking_uri, frame["run_id"].tolist())
    made, names = [], []
    for name, caption, build in _figure_plan(frame, axes, correlations, risks, history, info, online):
        paths, png = figures.save_sizes(build, out, name, formats)
        made.append(_Figure(name, caption, png))
        names += [p.name for p in paths]
    return made, names


def _reconstruction_caption(cell: dict, axes: Sequence[str], seed, note: str) -> str:
    label = ", ".join(f"{figures.axis_label(k)}: {value_text(k, v)}" for k, v in cell.items()) or "all"
    return f"Reconstructions, {label} (seed {seed}): original, encoder input, reconstruction. {note}"


def _reconstructions(frame: pd.DataFrame, axes: Sequence[str], tracking_uri: str,
                     out: Path, formats: Sequence[str] = ("png", "pdf")) -> tuple[list[_Figure], list[str]]:
    """The grid of the lowest-seed finished run of each cell: redrawn at both widths (vector
    PDF and PNG) from the ``reconstructions.npz`` the trial logged, or, for trials logged
    before they did, their ``reconstructions.png`` copied as it is. Cells without either are
    skipped. Returns the figures and the file names written."""
    finished = frame[frame["status"] == "FINISHED"]
    finished = finished.sort_values("seed", kind="stable") if "seed" in finished else finished
    if finished.empty:
        return [], []
    client = MlflowClient(tracking_uri)
    shown, names = [], []
    first = finished.groupby(list(axes), dropna=False, sort=True).head(1) if axes else finished.head(1)
    for _, row in first.iterrows():
        cell = {a: row[a] for a in axes}
        name = f"reconstructions_{_slug(cell)}"
        try:
            local = Path(client.download_artifacts(row["run_id"], reconstruction_grid.ARTIFACT, str(out)))
        except (MlflowException, OSError):
            local = None
        if local is not None:
            grid = reconstruction_grid.load_npz(local)
            local.unlink()
            vector = [f for f in formats if f != "png"] or ["pdf"]
            paths, png = figures.save_sizes(lambda w: reconstruction_grid.render(grid, w), out, name,
                                            ["png", *vector])
            names += [p.name for p in paths]
            shown.append(_Figure(f"fig_{name}", _reconstruction_caption(
                cell, axes, row.get("seed", "?"), reconstruction_grid.caption_note(grid)), png))
            continue
        try:
            local = Path(client.download_artifacts(row["run_id"], "reconstructions.png", str(out)))
        except (MlflowException, OSError):
            continue
        target = out / f"fig_{name}.png"
        local.replace(target)
        names.append(target.name)
        shown.append(_Figure(target.stem, _reconstruction_caption(
            cell, axes, row.get("seed", "?"), "As the trial logged it (a bitmap: these trials predate "
            "the logged arrays that give vector grids; masked patches are grey)."), target.read_bytes()))
    return shown, names


def outside_procedure_note(frame: pd.DataFrame) -> str:
    """A warning paragraph when some trials trained with augmentation (``augment`` other than
    none): the spec's procedure samples the images as they are, so those runs are outside it."""
    augmented = frame["augment"].fillna("none") != "none" if "augment" in frame else pd.Series(dtype=bool)
    if not augmented.any():
        return ""
    kinds = ", ".join(sorted(map(str, frame.loc[augmented, "augment"].unique())))
    return (f"<p class='failed'>{int(augmented.sum())} of {len(frame)} trials trained with augment="
            f"{html.escape(kinds)}: outside the specification's procedure, which samples each image "
            "as it is.</p>")


# ---------------------------------------------------------------------------------- entry


def _write_trials(frame: pd.DataFrame, axes: Sequence[str], out: Path) -> Path:
    """``trials.csv``: the frame itself, one row per trial (the cell's axes and the seed first,
    then status, then every other param and metric in name order)."""
    first = [c for c in [*axes, "seed", "status", "failure_reason", "run_id"] if c in frame]
    rest = sorted(c for c in frame.columns if c not in first)
    path = out / "trials.csv"
    frame[first + rest].to_csv(path, index=False)
    return path


def _write_tables(frame: pd.DataFrame, study: str, by: list[str], out: Path,
                  run_id: str = "") -> tuple[pd.DataFrame, list[Path]]:
    """``summary.{csv,md,tex}``: the numeric summary (csv) and its ``mean ± sd`` text (md, tex;
    every metric, so wide: the paper's table is :func:`_write_paper_table`'s)."""
    metrics = _present(frame, (*TABLE_METRICS, *block_metric_names(frame.columns)))  # + eval.probe_blocks'
    summary = summarise(frame, by, metrics)
    display = display_table(summary, by or ["study"], metrics)
    caption = (f"Study {study}: mean ± sd over seeds, n finished runs per cell "
               f"({len(frame)} trials); failed cells are marked in the note column.")
    paths = [out / "summary.csv", out / "summary.md", out / "summary.tex"]
    summary.to_csv(paths[0], index=False)
    paths[1].write_text(f"# {study}: summary by cell\n\n{caption}\n\n{markdown_table(display)}",
                        encoding="utf-8")
    # a label unique to this study run: two reports of one study can sit in one document
    label = f"tab:{study}-summary" + (f"-{run_id[:7]}" if run_id else "")
    paths[2].write_text(latex_table(display, caption, label), encoding="utf-8")
    return display, paths


def _write_paper_table(frame: pd.DataFrame, study: str, axes: list[str], info: dict, reference: dict,
                       out: Path) -> tuple[paper_table.StudyTable, Path]:
    """``paper_table.tex``: the study in MAE Table 1's form (:mod:`analysis.paper_table`)."""
    table = paper_table.study_table(frame, study, axes, reference, info.get("paper"), info["run_id"],
                                    smoke=info["smoke"])
    path = out / "paper_table.tex"
    header = (f"% {study}: MAE Table 1 form. Needs: {' '.join(paper_table.PACKAGES)}\n"
              f"% made by mae-study report from parent run {info['run_id']}\n")
    path.write_text(header + paper_table.study_latex(table), encoding="utf-8")
    return table, path


def _write_correlations(frame: pd.DataFrame, study: str, axes: list[str], out: Path,
                        smoke: bool = False) -> tuple[pd.DataFrame, str, list[str], list[Path]]:
    """``correlations.{csv,md}``: every (stratum, risk, downstream) row and the paragraph
    reading them; a smoke run keeps the rows but states no statistic."""
    finished = frame[frame["status"] == "FINISHED"]
    risks = _present(finished, RISK_METRICS)
    correlations = rank_correlations(frame, risks, _present(finished, DOWNSTREAM_METRICS), axes=axes)
    if smoke:
        numbers = [c for c in CORRELATION_COLUMNS if c.startswith(("spearman", "kendall"))]
        correlations[numbers] = math.nan
        correlations["reason"] = SMOKE_NOTE
    if smoke and len(correlations):
        reading = ("This is a smoke run (a few dozen updates on a few hundred images, to exercise "
                   "the code): no Spearman or Kendall rank correlation is claimed.")
        table = markdown_table(correlations[["stratum", "risk", "downstream", "n", "reason"]])
    elif len(correlations):
        reading = correlation_reading(correlations)
        table = markdown_table(correlations.round(3))
    else:
        reading, table = "No risk and downstream metric were both logged, so no correlation is reported.", ""
    paths = [out / "correlations.csv", out / "correlations.md"]
    correlations.to_csv(paths[0], index=False)
    paths[1].write_text(f"# {study}: rank correlations, risk vs downstream\n\n{reading}\n\n{table}",
                        encoding="utf-8")
    return correlations, reading, risks, paths


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
    metrics = _present(finished, DOWNSTREAM_METRICS)
    if not any(a in RISK_CHANGING_AXES for a in axes):
        metrics = _present(finished, RISK_METRICS) + metrics
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
        rows.append({"row": _cell_text({a: row[a] for a in axes}), "metric": row["metric"],
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
    return [(m, b) for m in _present(finished, DOWNSTREAM_METRICS)
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
    rows = [{"row": _cell_text({a: row[a] for a in axes}) if axes else "every trial", "metric": row["metric"],
             "against": _baseline_name(row["baseline"]), "n": int(row["n"]),
             "difference (row − baseline)": _number(row["mean_diff"], "+.3g"),
             "95% CI": _interval(row),
             "adjusted p": _number(row["p_holm"], ".2g"), "verdict": row["verdict"]} for _, row in table.iterrows()]
    return pd.DataFrame(rows), path


def _write_findings(frame: pd.DataFrame, study: str, axes: list[str], info: dict,
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
            f"decided above, in claims.csv, as one family at α = 0.05). Every row against the reference, "
            f"per metric. Reference row: {_cell_text(reference)}, {source}. Each row is compared with it "
            f"on every downstream accuracy (and on the risks when no axis changes what a risk measures), "
            f"paired by seed: the difference is row − reference over the seeds both finished, with a 95% "
            f"t-interval (not adjusted). The verdicts use the claims' four words, each {EXPLORATORY}: the "
            f"paired t-test and the TOST within the metric's ±delta of the rows of each metric are adjusted "
            f"together as one family (the claims' rule) and compared with 0.05; better or worse in the "
            f"metric's better sense (higher accuracy, lower risk), equivalent (the TOST), inconclusive "
            f"otherwise, which is not evidence of no effect (the last column: the smallest difference "
            f"those pairs would detect with 80% power at the observed spread). Being outside the family, "
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


def _write_search_findings(frame: pd.DataFrame, study: str, axes: list[str], info: dict,
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


def write_report(study: str, tracking_uri: str, out_dir: Path, *, formats: Sequence[str] = ("png", "pdf"),
                 experiment: str = "mae-study", parent_run_id: str | None = None,
                 smoke: bool | None = None, variance_dir: Path | None = None) -> Path:
    """Write the report of ``study`` (its newest run, or its run ``parent_run_id``) into
    ``out_dir``; return the path of ``index.html``. ``smoke`` True or False reports only a smoke
    or only a full run, and refuses (one line) when the run found is of the other kind.
    ``variance_dir``: where ``mae-study variance`` wrote the study's ``variance.csv`` (default:
    ``out_dir``'s sibling ``variance/``, as for the default report folder); when it holds one,
    the report shows where the noise comes from (:mod:`analysis.variance`).

    Raises :class:`~analysis.frame.ReportError` (one line) when the study has no runs, a
    format is unknown, or ``out_dir`` cannot be written.
    """
    unknown = [f for f in formats if f not in figures.FORMATS]
    if unknown:
        raise ReportError(f"figure format {unknown[0]!r} is not one of {', '.join(figures.FORMATS)}")
    info = load_study_info(tracking_uri, study, experiment, parent_run_id, smoke)
    frame = load_runs(tracking_uri, study, experiment, info["run_id"])
    out = _writable(out_dir)
    axes = [a for a in info["axes"] if a in frame]
    info["axes"] = axes
    # the effective ratio is a property of the cell: show it beside the nominal one
    by = axes + (["effective_mask_ratio"] if "mask_ratio" in axes and "effective_mask_ratio" in frame else [])

    trials_path = _write_trials(frame, axes, out)
    info_path = write_study_info(info, out)  # with trials.csv, enough to rebuild the tables
    write_findings = _write_search_findings if info.get("search") else _write_findings
    findings, findings_paths = write_findings(frame, study, axes, info, out)
    claims = claims_report.decide(frame, study, info, info.get("claims") or [])
    claim_paths, claims_png = claims_report.write_claims(claims, study, out, formats)
    display, table_paths = _write_tables(frame, study, by, out, info["run_id"])
    table, table_path = _write_paper_table(frame, study, axes, info, findings.reference, out)
    correlations, reading, risks, correlation_paths = _write_correlations(frame, study, axes, out,
                                                                          smoke=info["smoke"])
    figs, fig_files = _make_figures(frame, axes, tracking_uri, correlations, risks, out, formats, info)
    recons, recon_files = _reconstructions(frame, axes, tracking_uri, out, formats)
    files = [p.name for p in [trials_path, info_path, *claim_paths, *findings_paths, table_path, *table_paths,
                              *correlation_paths]]
    variance_html, variance_files = _variance_section(variance_dir or out.parent / variance.VARIANCE_DIR, out,
                                                      claims.table)
    index = out / "index.html"
    failures = [f"{_cell_text({a: row[a] for a in axes}) if axes else study}: {row['note']}"
                for _, row in display[display["note"] != ""].iterrows()]
    content = page.PageContent(
        study=study, smoke=info["smoke"], paper=info.get("paper"),
        run_rows=provenance(tracking_uri, study, info, frame).rows + [("experiment", experiment)],
        findings_text=findings.text, findings_table=findings.display,
        baselines_text=BASELINES_TEXT, baselines_table=findings.baselines,
        paper_table_html=paper_table.html_table(table), failures=failures, figures=figs,
        reconstructions=recons, correlation_reading=reading, correlations=correlations.round(3),
        summary=display, files=files + fig_files + recon_files + variance_files + [index.name],
        notes_html=outside_procedure_note(frame),
        numbers_file="search.csv" if info.get("search") else "comparisons.csv",
        claims_text=claims.text, claims_table=claims_report.display_table(claims.table),
        claims_figure=_Figure("claims", CLAIMS_CAPTION, claims_png) if claims_png else None,
        claims_skipped=claims.skipped, variance_html=variance_html)
    index.write_text(page.render(content), encoding="utf-8")
    return index


def _variance_section(folder: Path, out: Path, claims: pd.DataFrame | None = None) -> tuple[str, list[str]]:
    """The variance section and the files it copied or wrote into ``out`` (its csv and figure,
    and with ``claims`` each open claim priced in seeds and in repeats), when ``folder`` holds a
    ``variance.csv``; ("", []) otherwise."""
    table = variance.read_variance(folder)
    if table is None:
        return "", []
    copied = []
    for name in (variance.VARIANCE_FILE, "fig_variance.png", "fig_variance.pdf", "fig_variance.svg"):
        if (folder / name).is_file() and folder.resolve() != out.resolve():
            shutil.copyfile(folder / name, out / name)
            copied.append(name)
    png = out / "fig_variance.png"
    advice = variance.read_advice(folder)
    if advice is not None and folder.resolve() != out.resolve():
        shutil.copyfile(folder / variance.ADVICE_FILE, out / variance.ADVICE_FILE)
        copied.append(variance.ADVICE_FILE)
    spend = None
    if advice is not None and claims is not None and len(claims):
        spend = variance.claims_spend(claims, advice)
        if len(spend):
            spend.to_csv(out / variance.CLAIMS_SPEND_FILE, index=False)
            copied.append(variance.CLAIMS_SPEND_FILE)
    return variance.section_html(table, png.read_bytes() if png.is_file() else None, advice, spend), copied
