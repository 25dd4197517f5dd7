"""Paper figures from the trial frame (:func:`analysis.frame.load_runs`), in one style.

Every function takes the frame (a row per trial), plots FINISHED trials only, shows mean ± sd
over seeds, and returns the :class:`~matplotlib.figure.Figure` so a caller (or a test) can
inspect it; :func:`save_figure` writes it as ``fig_<name>.<fmt>``. Names on axes and legends are
the config's own keys and values, so a figure matches the tables and the run names.
"""

from __future__ import annotations

import io
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; reports run on machines without a screen
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from mae_core.config import Config

FORMATS = ("png", "pdf", "svg")
PNG_DPI = 200
from evaluation.metrics import ACCURACY, METRICS

PANEL_SIZE = (2.8, 2.8)  # inches per panel; tall enough for a one-line y label with its unit
FONT_SIZES = {"font.size": 8.5, "axes.labelsize": 8.5, "axes.titlesize": 8.5,
              "xtick.labelsize": 7.5, "ytick.labelsize": 7.5, "legend.fontsize": 7.5,
              "legend.title_fontsize": 7.5, "figure.titlesize": 8.5}
REFERENCE_COLOR = "0.45"  # grey: the random-init reference is context, not a result

AXIS_LABELS = {
    "mask_ratio": "mask ratio ρ (effective)", "effective_mask_ratio": "mask ratio ρ (effective)",
    "decoder_depth": "decoder depth (blocks)", "decoder_width": "decoder width (channels)",
    "encoder_depth": "encoder depth (blocks)", "encoder_width": "encoder width (channels)",
    "steps": "pretraining length (updates)", "target": "reconstruction target",
    "mask_sampling": "mask sampling", "mask_token_in_encoder": "mask token in encoder",
    "objective": "objective", "corruption": "corruption", "corruption_level": "corruption level",
    "lr": "base learning rate (per 256 images)", "batch_size": "batch size (images)",
    "eval.finetune_blocks": "blocks fine-tuned (last n; all: every weight)",
}
# Labels, units and references come from the one metric table (evaluation.metrics).
METRIC_LABELS = {m.name: m.label for m in METRICS.values() if m.kind == "downstream" or m.unit == "s"}
RISK_LABELS = {m.name: m.label for m in METRICS.values() if m.unit == "target" and m.kind != "bookkeeping"
               or m.name == "train_loss"}
# The reference each downstream metric is read against (seed 001: frozen MAE features can probe
# below a random encoder, so the random-init value belongs on the same axes).
REFERENCES = {m.name: m.reference for m in METRICS.values() if m.reference is not None}
REFERENCE_NAMES = {m.name: m.reference_name for m in METRICS.values() if m.reference_name is not None}
# Axes drawn as a line over a continuous x (MAE Figures 5 and 7); other axes are categories.
CONTINUOUS_AXES = {"mask_ratio", "steps", "corruption_level"}


# --------------------------------------------------------------------------------- style


def style_rc() -> dict:
    """The whole house style as rcParams: seaborn ticks/paper, colour-blind palette, no top or
    right spines, embedded TrueType in PDFs and a fixed SVG hash salt (reproducible files)."""
    rc = {**sns.axes_style("ticks"), **sns.plotting_context("paper", rc=FONT_SIZES)}
    rc.update({
        "axes.prop_cycle": matplotlib.cycler(color=sns.color_palette("colorblind")),
        "axes.spines.top": False, "axes.spines.right": False,
        "pdf.fonttype": 42, "svg.hashsalt": "mae-study", "savefig.bbox": "tight",
    })
    return rc


@contextmanager
def _styled() -> Iterator[None]:
    with matplotlib.rc_context(style_rc()):
        yield


def palette(n: int) -> list:
    return sns.color_palette("colorblind", n)


# -------------------------------------------------------------------------------- labels


def axis_label(axis: str) -> str:
    return AXIS_LABELS.get(axis, axis.replace("_", " "))


def metric_label(metric: str, frame: pd.DataFrame | None = None) -> str:
    """Axis label with units; risks are pixel² for raw targets, target units² otherwise."""
    if metric in RISK_LABELS:
        raw = frame is None or "target" not in frame or (frame["target"].dropna() == "raw").all()
        return f"{RISK_LABELS[metric]} ({'pixel²' if raw else 'target'} units)"
    return METRIC_LABELS.get(metric, metric.replace("_", " "))


def is_continuous(axis: str) -> bool:
    """True for axes plotted over a continuous x: :data:`CONTINUOUS_AXES` and float config keys."""
    field = Config.model_fields.get(axis)
    return axis in CONTINUOUS_AXES or (field is not None and field.annotation is float)


def x_column(frame: pd.DataFrame, axis: str) -> str:
    """The column to plot an axis over: the *effective* ratio (M-k)/M for the mask ratio."""
    effective = "effective_mask_ratio"
    if axis == "mask_ratio" and effective in frame and frame[effective].notna().all():
        return effective
    return axis


def _declared_order(key: str | None) -> list:
    """A Literal config key's values in the order Config declares them (e.g. raw, norm, norm_eps)."""
    field = Config.model_fields.get(key) if key else None
    if field is None:
        return []
    args = typing.get_args(field.annotation)
    literal = next((a for a in args if typing.get_origin(a) is typing.Literal), field.annotation)
    return list(typing.get_args(literal)) if typing.get_origin(literal) is typing.Literal else []


def category_order(values: pd.Series, key: str | None = None) -> list[str]:
    """Distinct values as text: a Literal key in Config's declared order, otherwise sorted
    (numbers numerically); None last."""
    distinct = list(dict.fromkeys(values.tolist()))
    present = [v for v in distinct if v is not None and v == v]
    declared = _declared_order(key if key is not None else values.name)
    rank = {v: i for i, v in enumerate(declared)}
    present.sort(key=lambda v: (rank.get(v, len(rank)), str(type(v)), v))
    missing = ["None"] if len(present) < len(distinct) else []
    return [str(v) for v in present] + missing


def as_text(values: pd.Series) -> pd.Series:
    """Category values as the text :func:`category_order` uses (None/NaN -> "None")."""
    return values.map(lambda v: "None" if v is None or v != v else str(v))


def _finished(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "FINISHED"] if "status" in frame else frame


def _has(frame: pd.DataFrame, metric: str) -> bool:
    return metric in frame and frame[metric].notna().any()


def _seed_note(frame: pd.DataFrame, by: Sequence[str]) -> str:
    """``mean ± sd over seeds (n=3 per cell)``, with the range when cells differ."""
    if frame.empty:
        return "no finished runs"
    if not by:
        return f"mean ± sd over n={len(frame)} runs"
    counts = frame.groupby(list(by), dropna=False).size()
    low, high = int(counts.min()), int(counts.max())
    return f"mean ± sd over seeds (n={low} per cell)" if low == high else \
        f"mean ± sd over seeds (n={low}–{high} per cell)"


def _new_figure(panels: int, width_scale: float = 1.0) -> tuple[Figure, np.ndarray]:
    fig, axes = plt.subplots(1, panels, figsize=(PANEL_SIZE[0] * panels * width_scale, PANEL_SIZE[1]),
                             squeeze=False, layout="constrained")
    return fig, axes[0]


# ------------------------------------------------------------------------------- panels


def _draw_panel(ax, data: pd.DataFrame, axis: str, metric: str, hue: str | None,
                reference: str | None) -> None:
    """``metric`` against ``axis`` (mean ± sd over seeds) and, dashed grey, the reference."""
    if not _has(data, metric):
        ax.text(0.5, 0.5, f"{metric}\nnot logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(axis_label(axis))
        return
    hue = x_column(data, hue) if hue else None
    hue_order = category_order(data[hue]) if hue else None
    # every cell keeps its slot, even one without this metric, so panels line up
    order = None if is_continuous(axis) else category_order(data[axis])
    data = data.dropna(subset=[metric])
    plotted = data.assign(**{hue: as_text(data[hue])}) if hue else data
    if is_continuous(axis):
        x = x_column(data, axis)
        sns.lineplot(data=plotted, x=x, y=metric, hue=hue, hue_order=hue_order, errorbar="sd",
                     marker="o", ax=ax, palette=palette(len(hue_order)) if hue else None,
                     color=None if hue else palette(1)[0])
        if reference and _has(data, reference):
            means = data.groupby(x)[reference].mean()
            ax.plot(means.index, means.to_numpy(), ls="--", marker=".", color=REFERENCE_COLOR,
                    label=REFERENCE_NAMES.get(reference, "random init"))
    else:
        plotted = plotted.assign(**{axis: as_text(data[axis])})
        ordinal = pd.api.types.is_numeric_dtype(data[axis]) and not pd.api.types.is_bool_dtype(data[axis])
        sns.pointplot(data=plotted, x=axis, y=metric, hue=hue, order=order, hue_order=hue_order,
                      errorbar="sd", capsize=0.15, linestyle="-" if ordinal else "none", ax=ax,
                      palette=palette(len(hue_order)) if hue else None,
                      color=None if hue else palette(1)[0], dodge=0.2 if hue else False)
        if reference and _has(data, reference):
            means = data.assign(_x=as_text(data[axis])).groupby("_x")[reference].mean()
            ax.plot(range(len(order)), means.reindex(order).to_numpy(), ls="--" if ordinal else "none",
                    marker="_", markersize=10, color=REFERENCE_COLOR,
                    label=REFERENCE_NAMES.get(reference, "random init"))
        ax.set_xlim(-0.5, len(order) - 0.5)  # a reference with gaps must not rescale the categories
    ax.set_xlabel(axis_label(axis))
    ax.set_ylabel(metric_label(metric, data))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(frameon=False, title=axis_label(hue) if hue else None)


# ------------------------------------------------------------------------------ figures


def metric_vs_axis(frame: pd.DataFrame, axis: str, metrics: Sequence[str], *,
                   hue: str | None = None) -> Figure:
    """One panel per metric against ``axis``: a line with a ±sd band over a continuous axis
    (x = effective mask ratio for ``mask_ratio``), points with ±sd bars for categories."""
    data = _finished(frame)
    with _styled():
        fig, axes = _new_figure(len(metrics))
        for ax, metric in zip(axes, metrics):
            _draw_panel(ax, data, axis, metric, hue, REFERENCES.get(metric))
        fig.suptitle(_seed_note(data, [axis] + ([hue] if hue else [])))
    return fig


def probe_and_finetune(frame: pd.DataFrame, axis: str, *, hue: str | None = None) -> Figure:
    """MAE Figure 5: linear probing and fine-tuning side by side against ``axis`` (linear and
    kNN when no trial was fine-tuned), each with its random-init reference."""
    second = "finetune_acc" if _has(_finished(frame), "finetune_acc") else "probe_knn_acc"
    return metric_vs_axis(frame, axis, ["probe_linear_acc", second], hue=hue)


def risk_vs_probe(frame: pd.DataFrame, risk: str, probe: str, correlation_text: str, *,
                  hue: str | None = None) -> Figure:
    """One point per finished trial (risk, probe), coloured by ``hue``, the correlation written on it."""
    data = _finished(frame).dropna(subset=[risk, probe])
    hue = x_column(data, hue) if hue else None
    with _styled():
        fig, (ax,) = _new_figure(1, width_scale=1.4)  # room for the legend on the right
        if hue:
            order = category_order(data[hue])
            sns.scatterplot(data=data.assign(**{hue: as_text(data[hue])}), x=risk, y=probe,
                            hue=hue, hue_order=order, palette=palette(len(order)), ax=ax, s=22)
            ax.legend(frameon=False, title=axis_label(hue), loc="upper left", bbox_to_anchor=(1.01, 1))
        else:
            sns.scatterplot(data=data, x=risk, y=probe, ax=ax, s=22, color=palette(1)[0])
        ax.text(0.03, 0.03, correlation_text, transform=ax.transAxes, ha="left", va="bottom",
                fontsize=FONT_SIZES["legend.fontsize"],
                bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": "0.8"})
        ax.set_xlabel(f"{metric_label(risk, data)}, lower is better")
        ax.set_ylabel(metric_label(probe, data))
        fig.suptitle(f"{len(data)} finished trials")
    return fig


def training_curves(history: pd.DataFrame, frame: pd.DataFrame, hue: str | None = None) -> Figure:
    """``history`` (``run_id, step, value``) per step, mean ± sd over seeds per ``hue`` value;
    log scale when every value is positive."""
    finished = _finished(frame)
    hue = x_column(finished, hue) if hue else None
    data = history.merge(finished[["run_id"] + ([hue] if hue else [])], on="run_id")
    with _styled():
        fig, (ax,) = _new_figure(1, width_scale=1.4)  # room for the legend on the right
        if hue:
            order = category_order(data[hue])
            sns.lineplot(data=data.assign(**{hue: as_text(data[hue])}), x="step", y="value",
                         hue=hue, hue_order=order, palette=palette(len(order)), errorbar="sd", ax=ax)
            ax.legend(frameon=False, title=axis_label(hue), loc="upper left", bbox_to_anchor=(1.01, 1))
        else:
            sns.lineplot(data=data, x="step", y="value", errorbar="sd", ax=ax, color=palette(1)[0])
        if len(data) and (data["value"] > 0).all():
            ax.set_yscale("log")
        ax.set_xlabel("update (step)")
        ax.set_ylabel(metric_label("train_loss", finished))
        fig.suptitle(_seed_note(finished, [hue] if hue else []))
    return fig


def objectives_comparison(frame: pd.DataFrame) -> Figure:
    """Grouped bars: each downstream metric for ae / dae / mae, and the random-init reference
    (pooled over all trials), mean ± sd over seeds."""
    data = _finished(frame)
    metrics = [m for m in ("probe_linear_acc", "probe_fewshot_acc", "probe_knn_acc", "finetune_acc")
               if _has(data, m)]
    names = {m: METRIC_LABELS[m].removesuffix(f" {ACCURACY}") for m in metrics}
    rows = [pd.DataFrame({"objective": data["objective"], "metric": names[m], "value": data[m]})
            for m in metrics]
    rows += [pd.DataFrame({"objective": "random init", "metric": names[m], "value": data[REFERENCES[m]]})
             for m in metrics if _has(data, REFERENCES[m])]
    long = pd.concat(rows, ignore_index=True).dropna(subset=["value"])
    order = category_order(long.loc[long["objective"] != "random init", "objective"], "objective")
    order += ["random init"] if (long["objective"] == "random init").any() else []
    with _styled():
        fig, (ax,) = _new_figure(1, width_scale=max(1.6, (1.3 * len(metrics) + 1.5) / PANEL_SIZE[0]))
        reference = "random init" in order
        colours = palette(len(order) - reference) + ([REFERENCE_COLOR] if reference else [])
        sns.barplot(data=long, x="metric", y="value", hue="objective", hue_order=order,
                    palette=colours, errorbar="sd", capsize=0.1, ax=ax)
        ax.set_xlabel("")
        ax.set_ylabel(ACCURACY)
        ax.set_ylim(0, 1)
        ax.legend(frameon=False, title="objective", ncols=len(order), loc="upper center",
                  bbox_to_anchor=(0.5, 1.18))
        fig.suptitle(_seed_note(data, ["objective"]), y=1.08)
    return fig


# ------------------------------------------------------------------------------- output


def save_figure(fig: Figure, out_dir: Path, name: str, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """Write ``out_dir/fig_<name>.<fmt>`` for each format (png at 200 dpi; pdf and svg vector),
    without timestamps so the same data give the same files."""
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


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG (200 dpi) in memory, for embedding in a self-contained page."""
    buffer = io.BytesIO()
    with _styled():
        fig.savefig(buffer, format="png", dpi=PNG_DPI, metadata={"Software": None})
    return buffer.getvalue()


def close(fig: Figure) -> None:
    plt.close(fig)
