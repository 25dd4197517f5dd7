"""A report's figures: which ones a study gets (its plan), their captions, and the saved files.

Each figure is saved at the full text width (``fig_<what>.<fmt>``, 7 in) and at one column
(``fig_<what>_column.<fmt>``, 3.3 in) for each requested format; the reconstructions as
``fig_reconstructions_<cell>.{png,pdf}`` when the trials logged their grids, and ``fig_online``
(each online metric against update, one line per cell) when trials logged the ``eval.every``
histories. Captions name the study's ``paper`` row; the figures themselves are
:mod:`analysis.figures`'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from evaluation import reconstruction_grid
from evaluation.metrics import ONLINE_METRICS, all_rows

from . import figures
from .trials_frame import load_history
from .labels import value_text
from .page import Figure as PageFigure
from .stats import MIN_CLUSTERS, MIN_TRIALS, plain_name
from .tables import SMOKE_NOTE, present

def probe_panels() -> tuple[str, ...]:
    """The probes figure's panels: the metric table's rows with ``figure="probes"`` (a plugin
    evaluator's included, hence read at each call): linear, few-shot, kNN, partial fine-tuning."""
    return tuple(m.name for m in all_rows() if m.figure == "probes")



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


def _slug(values: dict) -> str:
    text = "_".join(f"{k}-{v}" for k, v in values.items()) or "all"
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)


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
        if present(frame, ["finetune_acc"]):  # MAE Figure 5's two panels; otherwise "probes" shows them
            plan.append(("probe_and_finetune", caption(f"Linear-probe and fine-tuning accuracy {against}"),
                         lambda w: figures.probe_and_finetune(frame, axis, hue=hue, width=w)))
        if risks:
            plan.append(("risks", caption(f"Test risks {against}; band: the mean-pixel baseline"),
                         lambda w: figures.metric_vs_axis(frame, axis, list(risks), hue=hue, width=w)))
        probes = present(frame, probe_panels())
        if probes:
            plan.append(("probes", caption(f"Every probe's accuracy {against}"),
                         lambda w: figures.metric_vs_axis(frame, axis, probes, hue=hue, width=w)))
    if "objective" in axes:
        plan.append(("objectives", caption("Downstream accuracy by objective", ["objective"]),
                     lambda w: figures.objectives_comparison(frame, width=w)))
    primary = _primary_risk(frame, risks)
    if primary and present(frame, ["probe_linear_acc"]):
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


def make_figures(frame: pd.DataFrame, axes: Sequence[str], tracking_uri: str,
                  correlations: pd.DataFrame, risks: Sequence[str], out: Path,
                  formats: Sequence[str], info: dict) -> tuple[list[PageFigure], list[str]]:
    """Save every planned figure at both widths in ``formats``; keep the full width's PNG for
    the page. Returns the figures and the file names written."""
    if not (frame["status"] == "FINISHED").any():
        return [], []  # nothing to plot; the tables say why
    history = load_history(tracking_uri, frame["run_id"].tolist(), "train_loss")
    online = load_online(tracking_uri, frame["run_id"].tolist())
    made, names = [], []
    for name, caption, build in _figure_plan(frame, axes, correlations, risks, history, info, online):
        paths, png = figures.save_sizes(build, out, name, formats)
        made.append(PageFigure(name, caption, png))
        names += [p.name for p in paths]
    return made, names


def _reconstruction_caption(cell: dict, axes: Sequence[str], seed, note: str) -> str:
    label = ", ".join(f"{figures.axis_label(k)}: {value_text(k, v)}" for k, v in cell.items()) or "all"
    return f"Reconstructions, {label} (seed {seed}): original, encoder input, reconstruction. {note}"


def reconstructions(frame: pd.DataFrame, axes: Sequence[str], tracking_uri: str,
                     out: Path, formats: Sequence[str] = ("png", "pdf")) -> tuple[list[PageFigure], list[str]]:
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
            shown.append(PageFigure(f"fig_{name}", _reconstruction_caption(
                cell, axes, row.get("seed", "?"), reconstruction_grid.caption_note(grid)), png))
            continue
        try:
            local = Path(client.download_artifacts(row["run_id"], "reconstructions.png", str(out)))
        except (MlflowException, OSError):
            continue
        target = out / f"fig_{name}.png"
        local.replace(target)
        names.append(target.name)
        shown.append(PageFigure(target.stem, _reconstruction_caption(
            cell, axes, row.get("seed", "?"), "As the trial logged it (a bitmap: these trials predate "
            "the logged arrays that give vector grids; masked patches are grey)."), target.read_bytes()))
    return shown, names

