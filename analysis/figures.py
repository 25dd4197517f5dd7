"""Paper figures from the trial frame (:func:`analysis.trials_frame.load_runs`), drawn at print size.

As in MAE's Figure 5 and Table 1: one metric per panel, accuracies in %, every seed a small
point and each cell's mean a larger marker with its 95% t-interval over seeds
(:mod:`analysis.intervals`, clipped to the quantity's range). Baselines (random init, raw pixels,
from scratch, the mean-pixel predictor) are bands: their mean and 95% interval over seeds.

Every figure is drawn at the width it is printed at, :data:`WIDTHS` (one column of a two-column
paper, 3.3 in, or the full text width, 7 in), with text of at least :data:`MIN_FONT_PT`, and
saved at exactly that width (constrained layout, no tight bounding box). Legends and
annotations sit outside the axes, so no point is hidden. Ordered axes (numbers) get an ordered
palette; values read as words (:mod:`analysis.labels`).

Every function takes the frame (a row per trial), plots FINISHED trials only and returns the
:class:`~matplotlib.figure.Figure`; :func:`save_sizes` writes both widths.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; reports run on machines without a screen
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import offset_copy

from evaluation.metrics import ACCURACY, METRICS, Metric, all_rows
from mae_core.config import Config, declared_choices

from .intervals import LEVEL, mean_interval
from .labels import AXIS_LABELS, axis_label, is_accuracy, table_columns, value_text

__all__ = ["AXIS_LABELS", "axis_label"]  # re-exported: the labels live in analysis.labels

FORMATS = ("png", "pdf", "svg")
PNG_DPI = 200
WIDTHS = {"full": 7.0, "column": 3.3}  # inches: text width and one column of a two-column paper
MIN_FONT_PT = 7.0  # no text smaller than this at the printed width
FONT_SIZES = {"font.size": 8, "axes.labelsize": 8, "axes.titlesize": 8,
              "xtick.labelsize": 7, "ytick.labelsize": 7, "legend.fontsize": 7,
              "legend.title_fontsize": 7, "figure.titlesize": 8}
SEED_OFFSET = 6.0  # points from a cell's mean marker to its seeds (clear of the marker's 1.75 pt radius)
_LEGEND_ROOM = 0.5  # inches of height a figure adds for the legend below its panels

# Labels, units and references come from the one metric table (evaluation.metrics), read at each
# call rather than kept as constants, so a plugin evaluator's rows registered after import count too.


def _row(metric: str) -> Metric | None:
    """``metric``'s row among the table's fixed rows and the plugin evaluators' (a layer-wise
    ``probe_*_blockN`` name is neither: it gets no bands); None when it has none."""
    return next((row for row in all_rows() if row.name == metric), None)


def _risk_label(row: Metric | None) -> str | None:
    """A risk-like row's label (target units: the risks, baseline, diagnostics, the training loss)."""
    risk_like = row is not None and (row.unit == "target" and row.kind != "bookkeeping" or row.name == "train_loss")
    return row.label if risk_like else None


def _baselines(metric: str) -> tuple[str, ...]:
    """The metrics drawn as bands on ``metric``'s panel: the reference it is read against (seed
    001: frozen MAE features can probe below a random encoder, so the random-init value belongs
    on the same axes), then the further baselines (raw pixels, a from-scratch model)."""
    row = _row(metric)
    return tuple(b for b in (row.reference, *row.baselines) if b) if row else ()


# How each baseline band looks (its name is the metric's reference_name, else "random init").
BASELINE_STYLES = {
    "random init": {"color": "0.45", "ls": "--"},  # grey: context, not a result
    "raw pixels": {"color": "#a6761d", "ls": ":"},
    "from scratch (tuned length)": {"color": "#7570b3", "ls": "-."},
    "mean-pixel baseline": {"color": "0.45", "ls": "--"},
}
# Axes drawn over a continuous x (MAE Figures 5 and 7); other axes are categories.
CONTINUOUS_AXES = {"mask_ratio", "steps", "corruption_level"}


# --------------------------------------------------------------------------------- style


def style_rc() -> dict:
    """The whole house style as rcParams: seaborn ticks/paper, colour-blind palette, no top or
    right spines, embedded TrueType in PDFs, a fixed SVG hash salt (reproducible files), and
    files saved at the figure's own size (the printed width)."""
    rc = {**sns.axes_style("ticks"), **sns.plotting_context("paper", rc=FONT_SIZES)}
    rc.update({
        "axes.prop_cycle": matplotlib.cycler(color=sns.color_palette("colorblind")),
        "axes.spines.top": False, "axes.spines.right": False,
        "pdf.fonttype": 42, "svg.hashsalt": "mae-study", "savefig.bbox": "standard",
        "lines.linewidth": 1.0, "errorbar.capsize": 2.0,
    })
    return rc


@contextmanager
def _styled() -> Iterator[None]:
    with matplotlib.rc_context(style_rc()):
        yield


def palette(n: int) -> list:
    """Colour-blind-safe categorical colours."""
    return sns.color_palette("colorblind", n)


def ordered_palette(n: int) -> list:
    """Colours in order (viridis without its pale yellow end), for an ordered axis: ρ, steps, width."""
    cmap = matplotlib.colormaps["viridis"]
    return [cmap(v) for v in np.linspace(0.0, 0.8, n)] if n > 1 else [cmap(0.35)]


def _width(width: float | str) -> float:
    return WIDTHS[width] if isinstance(width, str) else float(width)


# -------------------------------------------------------------------------------- labels


def metric_label(metric: str, frame: pd.DataFrame | None = None) -> str:
    """Axis label with units: accuracies in %; risks in pixel² for raw targets, target units² otherwise."""
    row = _row(metric)
    risk = _risk_label(row)
    if risk is not None:
        raw = frame is None or "target" not in frame or (frame["target"].dropna() == "raw").all()
        return f"{risk} ({'pixel²' if raw else 'target'} units)"
    if is_accuracy(metric) and metric in METRICS:
        return METRICS[metric].label.replace(f" {ACCURACY}", " accuracy (%)")
    return row.label if row and (row.kind == "downstream" or row.unit == "s") else metric.replace("_", " ")


def is_continuous(axis: str) -> bool:
    """True for axes plotted over a continuous x: :data:`CONTINUOUS_AXES` and float config keys."""
    field = Config.model_fields.get(axis)
    return axis in CONTINUOUS_AXES or (field is not None and field.annotation is float)


def is_ordered(values: pd.Series) -> bool:
    """Numbers (not booleans) have an order: their palette and lines show it."""
    present = values.dropna()
    return (len(present) > 0 and pd.api.types.is_numeric_dtype(present)
            and not pd.api.types.is_bool_dtype(present))


def x_column(frame: pd.DataFrame, axis: str) -> str:
    """The column to plot an axis over: the *effective* ratio (M-k)/M for the mask ratio."""
    effective = "effective_mask_ratio"
    if axis == "mask_ratio" and effective in frame and frame[effective].notna().all():
        return effective
    return axis


def levels(values: pd.Series, key: str | None = None) -> list:
    """Distinct values: a choice key in its declared order (config.declared_choices), otherwise sorted (numbers
    numerically, False before True); None last."""
    distinct = [v.item() if isinstance(v, np.generic) else v for v in dict.fromkeys(values.tolist())]
    present = [v for v in distinct if v is not None and v == v]
    key = key if key is not None else values.name
    declared = declared_choices(key) if key else []  # raw, norm, norm_eps; mae, ae, dae
    rank = {v: i for i, v in enumerate(declared)}
    present.sort(key=lambda v: (rank.get(v, len(rank)), str(type(v)), v))
    return present + ([None] if len(present) < len(distinct) else [])


def category_order(values: pd.Series, key: str | None = None) -> list[str]:
    """:func:`levels` as text (None -> "None"), the keys :func:`as_text` gives."""
    return ["None" if v is None else str(v) for v in levels(values, key)]


def as_text(values: pd.Series) -> pd.Series:
    """Category values as the text :func:`category_order` uses (None/NaN -> "None")."""
    return values.map(lambda v: "None" if v is None or v != v else str(v))


def _finished(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "FINISHED"] if "status" in frame else frame


def _has(frame: pd.DataFrame, metric: str) -> bool:
    return metric in frame and frame[metric].notna().any()


def seed_note(frame: pd.DataFrame, by: Sequence[str]) -> str:
    """``n=3 seeds per cell`` (a range when cells differ), for a caption."""
    data = _finished(frame)
    if data.empty:
        return "no finished runs"
    if not by:
        return f"n={len(data)} runs"
    counts = data.groupby(list(by), dropna=False).size()
    low, high = int(counts.min()), int(counts.max())
    return f"n={low} seeds per cell" if low == high else f"n={low}–{high} seeds per cell"


# ------------------------------------------------------------------------------- layout


def _grid(panels: int, width: float, legend: bool) -> tuple[Figure, list, tuple[float, float]]:
    """Panels in rows at ``width`` inches: one column of up to two stacked panels (as MAE
    Figure 5) or two per row at column width; up to four per row at full width. Returns the
    figure, its axes and one panel's (width, height) in inches."""
    narrow = width < 4.0
    ncols = 1 if narrow and panels <= 2 else min(panels, 2 if narrow else 4)
    nrows = math.ceil(panels / ncols)
    panel_height = min(2.3, max(1.8, 0.75 * width / ncols))
    fig = plt.figure(figsize=(width, nrows * panel_height + (_LEGEND_ROOM if legend else 0)),
                     layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for extra in axes[panels:]:
        extra.remove()
    return fig, axes[:panels], (width / ncols, panel_height)


def _legend(fig: Figure, handles: list, labels: list, title: str | None = None, where: str = "lower") -> None:
    """One figure legend outside the panels (below or above), as many columns as fit."""
    if not handles:
        return
    per_row = max(1, int(fig.get_figwidth() / 1.25))
    fig.legend(handles, labels, loc=f"outside {where} center", ncols=min(len(handles), per_row),
               frameon=False, title=title)


def _wrap(text: str, inches: float, points: float = 7.0) -> str:
    """Break a label that would not fit ``inches`` at ``points`` (≈ 0.52 em per character)."""
    chars = max(6, int(inches * 72 / (0.52 * points)))
    return textwrap.fill(text, chars) if len(text) > chars else text


# ------------------------------------------------------------------------------- panels


def _bounds(metric: str) -> tuple[float, float]:
    """The range a metric can take, in plotted units: accuracies [0, 100], squared errors ≥ 0."""
    if is_accuracy(metric):
        return 0.0, 100.0
    known = METRICS.get(metric)
    if known is not None and known.unit in ("target", "s"):
        return 0.0, math.inf
    return -math.inf, math.inf


def _baseline_name(metric: str) -> str:
    """A band's legend name: every ``random_*`` metric is the same evaluation of the random-init
    model (its fine-tuning too), so one name and one style serve every panel."""
    if metric.startswith("random_"):
        return "random init"
    row = _row(metric)
    return row.reference_name if row and row.reference_name else metric


def _seed_values(data: pd.DataFrame, column: str) -> pd.Series:
    """One value per seed (the mean of that seed's trials), or per trial without seeds."""
    values = data[column].dropna()
    if "seed" not in data:
        return values
    return data.loc[values.index].groupby("seed")[column].mean()


def _constant_across_cells(data: pd.DataFrame, column: str) -> bool:
    """True when every trial of a seed logged the same value: the baseline does not depend on
    the cell (a random-init encoder or raw pixels under a decoder ablation), so one band serves."""
    if "seed" not in data:
        return False
    spread = data.dropna(subset=[column]).groupby("seed")[column].agg(lambda v: v.max() - v.min())
    return bool(len(spread)) and float(spread.max()) <= 1e-12


def _draw_baseline(ax, data: pd.DataFrame, column: str, xs: dict, scale: float,
                   bounds: tuple[float, float]) -> tuple | None:
    """A band (mean and 95% interval over seeds) for baseline ``column``; a legend handle."""
    if not _has(data, column):
        return None
    style = BASELINE_STYLES.get(_baseline_name(column), BASELINE_STYLES["random init"])
    band = {"color": style["color"], "alpha": 0.18, "lw": 0, "zorder": 1}
    line = {"color": style["color"], "ls": style["ls"], "lw": 1.0, "zorder": 1.5}
    if _constant_across_cells(data, column):
        interval = mean_interval(_seed_values(data, column) * scale, bounds)
        if interval.low == interval.low:
            ax.axhspan(interval.low, interval.high, **band)
        ax.axhline(interval.mean, **line)
    else:  # it varies with the cell: a band over each cell's slot
        for x, position in xs.items():
            cell = data[data["_x"] == x]
            interval = mean_interval(_seed_values(cell, column) * scale, bounds)
            if interval.mean != interval.mean:
                continue
            span = position if isinstance(position, tuple) else (position - 0.4, position + 0.4)
            if interval.low == interval.low:
                ax.fill_between(span, interval.low, interval.high, **band)
            ax.plot(span, [interval.mean] * 2, **line)
    return (Patch(facecolor=style["color"], alpha=0.18, lw=0), Line2D([], [], **line)), _baseline_name(column)


def _continuous_spans(values: list[float]) -> dict:
    """Each x's slot on a continuous axis: halfway to its neighbours (a band per cell)."""
    if len(values) == 1:
        return {values[0]: (values[0] - 0.5, values[0] + 0.5)}
    edges = [values[0] - (values[1] - values[0]) / 2]
    edges += [(a + b) / 2 for a, b in zip(values, values[1:])]
    edges.append(values[-1] + (values[-1] - values[-2]) / 2)
    return {v: (edges[i], edges[i + 1]) for i, v in enumerate(values)}


def _draw_panel(ax, data: pd.DataFrame, axis: str, metric: str, hue: str | None,
                baselines: Sequence[str], panel: tuple[float, float]) -> list[tuple]:
    """``metric`` against ``axis``: seeds as points, means with 95% intervals, baselines as
    bands. Returns the legend entries ``(handle, label, group)`` it drew."""
    ax.set_xlabel(_wrap(axis_label(axis), 0.7 * panel[0], FONT_SIZES["axes.labelsize"]))
    if not _has(data, metric):
        ax.text(0.5, 0.5, f"{metric}\nnot logged", ha="center", va="center", transform=ax.transAxes)
        return []
    scale = 100.0 if is_accuracy(metric) else 1.0
    bounds = _bounds(metric)
    continuous = is_continuous(axis)
    x_key = x_column(data, axis) if continuous else axis
    order = levels(data[x_key], axis)
    data = data.assign(_x=data[x_key].map(lambda v: None if v is None or v != v else v))
    hue_key = x_column(data, hue) if hue else None
    hue_levels = levels(data[hue_key], hue) if hue else [None]
    colours = (ordered_palette if hue and is_ordered(data[hue_key]) else palette)(len(hue_levels))
    if not hue:
        colours = palette(1)
    ordered = continuous or is_ordered(data[axis])
    if continuous:
        positions = {v: float(v) for v in order if v is not None}
        spans = _continuous_spans(sorted(positions.values()))
        slots = {v: spans[positions[v]] for v in positions}
        dodge = [0.0] * len(hue_levels)
    else:
        positions = {v: float(i) for i, v in enumerate(order)}
        slots = positions
        dodge = np.linspace(-0.2, 0.2, len(hue_levels)) if hue else [0.0]
    entries = []
    for column in baselines:
        made = _draw_baseline(ax, data, column, slots, scale, bounds)
        if made:
            entries.append((*made, "baseline"))
    measured = data.dropna(subset=[metric])
    for h, colour, offset in zip(hue_levels, colours, dodge):
        rows = measured if not hue else measured[(measured[hue_key] == h) if h is not None
                                                 else measured[hue_key].isna()]
        xs, means, lows, highs = [], [], [], []
        for value, position in positions.items():
            cell = rows[rows["_x"].isna()] if value is None else rows[rows["_x"] == value]
            if cell.empty:
                continue
            y = cell[metric].to_numpy(float) * scale
            x = position + offset
            # seeds sit SEED_OFFSET points left of their mean, so its marker never covers one;
            # categories spread them a little (deterministic), so equal values stay visible
            jitter = np.zeros(len(y)) if continuous else 0.06 * (np.arange(len(y)) / max(1, len(y) - 1) - 1)
            # unclipped: a seed at exactly 100% sits on the axes' edge and stays whole
            ax.scatter(x + jitter, y, s=9, color=colour, alpha=0.45, lw=0, zorder=2, clip_on=False,
                       transform=offset_copy(ax.transData, fig=ax.figure, x=-SEED_OFFSET, units="points"))
            # drawn through a shifted transform, the seeds are left out of the autoscaled limits:
            # a seed beyond its mean's interval would sit on or under the axes' edge
            ax.update_datalim(np.column_stack([x + jitter, y]))
            interval = mean_interval(y, bounds)
            xs.append(x), means.append(interval.mean)
            lows.append(interval.mean - interval.low if interval.low == interval.low else 0.0)
            highs.append(interval.high - interval.mean if interval.high == interval.high else 0.0)
        if xs:
            ax.errorbar(xs, means, yerr=[lows, highs], fmt="o-" if ordered else "o", ms=3.5, lw=1.0,
                        color=colour, zorder=3, elinewidth=1.0, clip_on=False)
            if hue:
                entries.append((Line2D([], [], color=colour, marker="o", ms=3.5), value_text(hue, h), "hue"))
    if continuous:
        ticks = sorted(positions.values())
        if len(ticks) <= 8:
            ax.set_xticks(ticks, [format(t, "g") for t in ticks])
    else:
        slot = panel[0] * 0.8 / max(1, len(order))
        ax.set_xticks(list(positions.values()), [_wrap(value_text(axis, v), slot) for v in order])
        ax.set_xlim(-0.5, len(order) - 0.5)
    # a label longer than the axes is tall (a column's stacked panels) breaks into two lines
    ax.set_ylabel(_wrap(metric_label(metric, data), 0.72 * panel[1], FONT_SIZES["axes.labelsize"]))
    if scale == 100.0:  # an accuracy: never beyond [0, 100], whatever the margins say
        low, high = ax.get_ylim()
        ax.set_ylim(max(low, 0.0), min(high, 100.0))
    return entries


def _finish_legends(fig: Figure, entries: list[tuple], hue: str | None) -> None:
    """The hue legend above the panels, the baselines' below; each entry once."""
    for group, where, title in (("hue", "upper", axis_label(hue) if hue else None), ("baseline", "lower", None)):
        seen: dict[str, object] = {}
        for handle, label, kind in entries:
            if kind == group and label not in seen:
                seen[label] = handle
        _legend(fig, list(seen.values()), list(seen), title, where)


# ------------------------------------------------------------------------------ figures


def metric_vs_axis(frame: pd.DataFrame, axis: str, metrics: Sequence[str], *,
                   hue: str | None = None, width: float | str = "full") -> Figure:
    """One panel per metric against ``axis`` (x = effective mask ratio for ``mask_ratio``):
    seeds as points, each cell's mean with its 95% t-interval, baselines as bands."""
    data = _finished(frame)
    inches = _width(width)
    present = [b for m in metrics for b in _baselines(m)]
    with _styled():
        fig, axes, panel = _grid(len(metrics), inches, legend=bool(hue) or any(_has(data, b) for b in present))
        entries = []
        for ax, metric in zip(axes, metrics):
            entries += _draw_panel(ax, data, axis, metric, hue, _baselines(metric), panel)
        _finish_legends(fig, entries, hue)
    return fig


def probe_and_finetune(frame: pd.DataFrame, axis: str, *, hue: str | None = None,
                       width: float | str = "full") -> Figure:
    """MAE Figure 5: linear probing and fine-tuning side by side against ``axis`` (linear and
    kNN when no trial was fine-tuned), each with its baselines. A study that fine-tunes part of
    the encoder (MAE Figure 9) shows that accuracy: full fine-tuning is one row of it, the same
    value in every cell."""
    finished = _finished(frame)
    # the metric table says which rows may be the second panel, in order (Metric.finetune_panel)
    candidates = [row.name for row in sorted(all_rows(), key=lambda row: row.finetune_panel) if row.finetune_panel]
    second = next((m for m in candidates if _has(finished, m)), candidates[-1])
    return metric_vs_axis(frame, axis, ["probe_linear_acc", second], hue=hue, width=width)


def risk_vs_probe(frame: pd.DataFrame, risk: str, probe: str, correlation_text: str, *,
                  hue: str | None = None, width: float | str = "full") -> Figure:
    """One point per finished trial (risk, probe), coloured by ``hue``; the correlation is
    written below the axes (never over a point)."""
    data = _finished(frame).dropna(subset=[risk, probe])
    hue = x_column(data, hue) if hue else None
    inches = _width(width)
    scale = 100.0 if is_accuracy(probe) else 1.0
    with _styled():
        fig = plt.figure(figsize=(inches, min(3.2, 0.62 * inches) + 0.9 + (_LEGEND_ROOM if hue else 0)),
                         layout="constrained")
        ax = fig.subplots()
        if hue:
            order = levels(data[hue])
            colours = (ordered_palette if is_ordered(data[hue]) else palette)(len(order))
            colour_of = {("None" if v is None else str(v)): c for v, c in zip(order, colours)}
            ax.scatter(data[risk], data[probe] * scale, s=12, lw=0,
                       c=[colour_of[t] for t in as_text(data[hue])])
            handles = [Line2D([], [], ls="none", marker="o", ms=3.5, color=c) for c in colours]
            _legend(fig, handles, [value_text(hue, v) for v in order], axis_label(hue), "upper")
        else:
            ax.scatter(data[risk], data[probe] * scale, s=12, lw=0, color=palette(1)[0])
        ax.set_xlabel(f"{metric_label(risk, data)}, lower is better")
        ax.set_ylabel(metric_label(probe, data))
        # below the x label, inside the figure's layout: a point can never sit under it
        ax.annotate(correlation_text, xy=(0, 0), xycoords=("axes fraction", ax.xaxis.label),
                    xytext=(0, -4), textcoords="offset points", ha="left", va="top",
                    fontsize=FONT_SIZES["legend.fontsize"], annotation_clip=False)
    return fig


def training_curves(history: pd.DataFrame, frame: pd.DataFrame, hue: str | None = None,
                    width: float | str = "full") -> Figure:
    """``history`` (``run_id, step, value``) per step: the mean over seeds per ``hue`` value,
    with its 95% interval as a band (never below zero); log scale when every value is positive."""
    finished = _finished(frame)
    hue = x_column(finished, hue) if hue else None
    data = history.merge(finished[["run_id"] + ([hue] if hue else [])], on="run_id")
    inches = _width(width)
    with _styled():
        fig = plt.figure(figsize=(inches, min(2.6, 0.6 * inches) + (_LEGEND_ROOM if hue else 0)),
                         layout="constrained")
        ax = fig.subplots()
        order = levels(data[hue]) if hue else [None]
        colours = (ordered_palette if hue and is_ordered(data[hue]) else palette)(len(order))
        handles = []
        for value, colour in zip(order, colours):
            rows = data if not hue else data[data[hue] == value] if value is not None else data[data[hue].isna()]
            stats = [(step, mean_interval(group["value"], (0.0, math.inf)))
                     for step, group in rows.groupby("step", sort=True)]
            if not stats:
                continue
            steps = [s for s, _ in stats]
            ax.plot(steps, [i.mean for _, i in stats], color=colour)
            low = np.array([i.low for _, i in stats])
            if np.isfinite(low).any():
                ax.fill_between(steps, low, [i.high for _, i in stats], color=colour, alpha=0.18, lw=0)
            handles.append(Line2D([], [], color=colour))
        if hue:
            _legend(fig, handles, [value_text(hue, v) for v in order], axis_label(hue), "upper")
        if len(data) and (data["value"] > 0).all():
            ax.set_yscale("log", nonpositive="clip")
        ax.set_xlabel("update (step)")
        ax.set_ylabel(metric_label("train_loss", finished))
    return fig


def online_curves(histories: pd.DataFrame, frame: pd.DataFrame, axes: Sequence[str] = (),
                  width: float | str = "full") -> Figure:
    """The online evaluation's histories (``eval.every``; ``histories``: ``run_id, metric, step,
    value``) against update, one panel per metric and one line per cell: the mean over seeds
    with its 95% interval as a band. Colour is the first axis, line style the second."""
    finished = _finished(frame)
    hue = x_column(finished, axes[0]) if axes else None
    style = axes[1] if len(axes) > 1 else None
    data = histories.merge(finished[["run_id"] + [c for c in (hue, style) if c]], on="run_id")
    metrics = [m for m in METRICS if m in set(data["metric"])]
    hues = levels(data[hue]) if hue else [None]
    styles = levels(data[style]) if style else [None]
    colours = (ordered_palette if hue and is_ordered(data[hue]) else palette)(len(hues))
    dashes = ["-", "--", ":", "-."]

    def rows_of(rows: pd.DataFrame, column: str | None, value) -> pd.DataFrame:
        if column is None:
            return rows
        return rows[rows[column].isna()] if value is None else rows[rows[column] == value]

    raw = "target" not in finished or (finished["target"].dropna() == "raw").all()
    with _styled():
        fig, panels, size = _grid(len(metrics), _width(width), legend=bool(hue or style))
        for ax, metric in zip(panels, metrics):
            scale = 100.0 if is_accuracy(metric) else 1.0
            for value, colour in zip(hues, colours):
                for number, kind in enumerate(styles):
                    rows = rows_of(rows_of(data[data["metric"] == metric], hue, value), style, kind)
                    stats = [(step, mean_interval(group["value"] * scale, _bounds(metric)))
                             for step, group in rows.groupby("step", sort=True)]
                    if not stats:
                        continue
                    steps = [s for s, _ in stats]
                    ax.plot(steps, [i.mean for _, i in stats], color=colour, ls=dashes[number % len(dashes)])
                    low = np.array([i.low for _, i in stats])
                    if np.isfinite(low).any():
                        ax.fill_between(steps, low, [i.high for _, i in stats], color=colour, alpha=0.18, lw=0)
            unit = "%" if scale == 100.0 else f"{'pixel²' if raw else 'target'} units"
            ax.set_xlabel("update (step)")
            ax.set_ylabel(_wrap(f"{METRICS[metric].label} ({unit})", size[1]))
        if hue:
            _legend(fig, [Line2D([], [], color=c) for c in colours], [value_text(axes[0], v) for v in hues],
                    axis_label(axes[0]), "upper")
        if style:
            _legend(fig, [Line2D([], [], color="0.3", ls=dashes[i % len(dashes)]) for i in range(len(styles))],
                    [value_text(style, v) for v in styles], axis_label(style), "lower")
    return fig


def objectives_comparison(frame: pd.DataFrame, width: float | str = "full") -> Figure:
    """Each accuracy of MAE Table 1's columns (:func:`analysis.labels.table_columns`: fine-tune,
    linear, few-shot, kNN) by objective, one panel per metric, with the baselines as bands."""
    data = _finished(frame)
    metrics = [m for m in table_columns() if _has(data, m)]  # MAE Table 1's columns, a plugin's too
    return metric_vs_axis(frame, "objective", metrics, width=width)


# ------------------------------------------------------------------------------- output


def save_figure(fig: Figure, out_dir: Path, name: str, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """Write ``out_dir/fig_<name>.<fmt>`` for each format (png at 200 dpi; pdf and svg vector),
    at the figure's own size and without timestamps, so the same data give the same files."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"figure format {unknown[0]!r} is not one of {', '.join(FORMATS)}")
    metadata = {"png": {"Software": None}, "pdf": {"CreationDate": None}, "svg": {"Date": None}}
    paths = []
    with _styled():
        for fmt in formats:
            path = Path(out_dir) / f"fig_{name}.{fmt}"
            fig.savefig(path, format=fmt, dpi=PNG_DPI if fmt == "png" else None, metadata=metadata[fmt])
            paths.append(path)
    return paths


def size_suffix(size: str) -> str:
    """File-name suffix of a size: the full width is the plain name, a column ``_column``."""
    return "" if size == "full" else f"_{size}"


def save_sizes(build: Callable[[float], Figure], out_dir: Path, name: str,
               formats: Sequence[str] = ("png", "pdf")) -> tuple[list[Path], bytes]:
    """Draw ``build(width)`` at each of :data:`WIDTHS` and save ``fig_<name>.<fmt>`` (full
    width) and ``fig_<name>_column.<fmt>``; return the paths and the full width's PNG."""
    paths: list[Path] = []
    png = b""
    for size, inches in WIDTHS.items():
        fig = build(inches)
        try:
            paths += save_figure(fig, out_dir, name + size_suffix(size), formats)
            if size == "full":
                png = png_bytes(fig) if "png" not in formats else (Path(out_dir) / f"fig_{name}.png").read_bytes()
        finally:
            close(fig)
    return paths, png


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG (200 dpi) in memory, for embedding in a self-contained page."""
    buffer = io.BytesIO()
    with _styled():
        fig.savefig(buffer, format="png", dpi=PNG_DPI, metadata={"Software": None})
    return buffer.getvalue()


def interval_note() -> str:
    """What the marks of every figure mean, for a caption."""
    return (f"small points are seeds; large markers their mean with its {LEVEL:.0%} t-interval over "
            f"seeds; bands are baselines, their mean and {LEVEL:.0%} interval over seeds")


def close(fig: Figure) -> None:
    plt.close(fig)
