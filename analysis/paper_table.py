"""MAE Table 1 in LaTeX: a compact table per study, and one table with a sub-table per study.

Rows are a study's cells (the setting in words, in the axis's order), then its baselines in
italics below a rule (random init, raw pixels, a model trained from scratch); columns are
fine-tune | linear | few-shot | kNN accuracy on the test split in %, to one decimal: the mean
over seeds, with ± the half-width of its 95% t-interval (:mod:`analysis.intervals`) in small
type. The reference row (the study's ``reference``) is shaded.

Decimal alignment without siunitx: every number has exactly one decimal and every ± part is
padded to one width (``\\hphantom``), so a right-aligned column lines the means' points up. (A
separate ± column, ``r@{}l``, would be simpler, but colortbl's row shading then paints over the
mean's last digit.)
Packages: :data:`PACKAGES` (booktabs; xcolor with its ``table`` option for ``\\rowcolor``),
both in TeX Live's ``latex-recommended`` set.
"""

from __future__ import annotations

import html
import math
import string
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .figures import levels, x_column
from .intervals import LEVEL, Interval, mean_interval
from .labels import baseline_rows, setting_name, table_columns, table_head, value_text

PACKAGES = (r"\usepackage{booktabs}", r"\usepackage[table]{xcolor}")
REFERENCE_SHADE = "gray!15"
_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
        "±": r"$\pm$", "×": r"$\times$", "—": "--", "–": "--", "ρ": r"$\rho$", "τ": r"$\tau$",
        "ε": r"$\epsilon$", "²": r"$^2$", "≥": r"$\geq$", "≤": r"$\leq$"}


def tex(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (and the few Unicode symbols we use)."""
    return "".join(_TEX.get(ch, ch) for ch in str(text))


@dataclass
class Row:
    setting: str  # the cell in words ("not in encoder", "8", "gaussian, 0.3")
    values: dict[str, Interval]  # column metric -> interval of its accuracy in %
    n: int  # finished trials in the cell
    reference: bool = False
    baseline: bool = False


@dataclass
class StudyTable:
    """One study as Table 1 shows it."""

    study: str
    paper: str | None
    axes: list[str]
    columns: list[str]  # metrics of :func:`labels.table_columns` that the study logged
    rows: list[Row]
    run_id: str = ""
    notes: list[str] = field(default_factory=list)  # e.g. "digits, 1000 updates"

    @property
    def label(self) -> str:
        """Unique per study run: the study's name and the parent run's id, shortened as git does."""
        return f"tab:{self.study}" + (f"-{self.run_id[:7]}" if self.run_id else "")

    @property
    def title(self) -> str:
        return ", ".join(setting_name(a) for a in self.axes) or self.study.replace("_", " ")

    def seeds_text(self) -> str:
        counts = sorted({r.n for r in self.rows if not r.baseline and r.n})
        if not counts:
            return "no finished trials"
        return f"n={counts[-1]} seeds" if len(counts) == 1 else f"n={counts[0]}–{counts[-1]} seeds"


# ---------------------------------------------------------------------------------- rows


def _accuracy(values: pd.Series) -> Interval:
    return mean_interval(values.to_numpy(float) * 100.0, (0.0, 100.0))


def _per_seed(data: pd.DataFrame, column: str) -> pd.Series:
    """A baseline once per seed (its mean over the cells: the same value where it does not
    depend on the cell), so a seed is not counted once per cell."""
    values = data.dropna(subset=[column])
    return values.groupby("seed")[column].mean() if "seed" in values else values[column]


def _setting(axes: Sequence[str], cell: dict) -> str:
    return ", ".join(value_text(a, cell[a]) for a in axes) or "all"


def study_table(frame: pd.DataFrame, study: str, axes: Sequence[str], reference: dict | None,
                paper: str | None = None, run_id: str = "", smoke: bool = False) -> StudyTable:
    """The rows of ``frame`` (a row per trial) as Table 1 shows them: a row per cell in the
    axes' order, the ``reference`` cell marked, then a row per baseline that was logged. A
    ``smoke`` run's notes say so first, so its caption can never pass for a finding."""
    finished = frame[frame["status"] == "FINISHED"] if "status" in frame else frame
    columns = [m for m in table_columns() if m in finished and finished[m].notna().any()]
    # the mask ratio reads as the effective ratio (M-k)/M, the one that was run
    keys = [x_column(frame, a) for a in axes]
    rows = []
    cells = pd.MultiIndex.from_product([levels(frame[k], a) for k, a in zip(keys, axes)]) if axes else [()]
    for values in cells:
        cell = dict(zip(keys, values if isinstance(values, tuple) else (values,)))
        mask = pd.Series(True, index=frame.index)
        for key, value in cell.items():
            mask &= frame[key].isna() if value is None else frame[key] == value
        if axes and not mask.any():
            continue  # a combination the grid did not have
        rows_here = finished[mask.reindex(finished.index, fill_value=False)]
        nominal = {a: frame.loc[mask, a].iloc[0] for a in axes}
        is_reference = bool(reference) and all(_same(nominal.get(a), v) for a, v in reference.items())
        rows.append(Row(_setting(axes, dict(zip(axes, cell.values()))),
                        {m: _accuracy(rows_here[m]) for m in columns}, len(rows_here), is_reference))
    for name, fills in baseline_rows().items():
        values = {m: _accuracy(_per_seed(finished, fills[m])) for m in columns
                  if m in fills and fills[m] in finished and finished[fills[m]].notna().any()}
        if values:
            n = max(v.n for v in values.values())
            rows.append(Row(name, values, n, baseline=True))
    notes = (["SMOKE RUN, not a finding"] if smoke else []) + _notes(finished)
    return StudyTable(study, paper, list(axes), columns, rows, run_id, notes)


def _same(a, b) -> bool:
    """Equal as axis values: numpy scalars read as Python ones, and True is not 1."""
    a, b = (v.item() if isinstance(v, np.generic) else v for v in (a, b))
    if a is None or b is None:
        return a is None and b is None
    try:
        return bool(a == b) and (isinstance(a, bool) == isinstance(b, bool))
    except (TypeError, ValueError):
        return False


def _notes(finished: pd.DataFrame) -> list[str]:
    """What every trial shared: the dataset and the pretraining length, where constant."""
    notes = []
    for key, fmt in (("dataset", "{}"), ("steps", "{} updates")):
        if key in finished and finished[key].nunique(dropna=False) == 1 and len(finished):
            notes.append(fmt.format(finished[key].iloc[0]))
    return notes


# --------------------------------------------------------------------------------- LaTeX


def _number(interval: Interval | None) -> tuple[str, str]:
    """(mean, ± text) to one decimal: "84.2", "0.8"; "--" and "" when missing."""
    if interval is None or interval.mean != interval.mean:
        return "--", ""
    spread = "" if interval.half_width != interval.half_width else f"{interval.half_width:.1f}"
    return f"{interval.mean:.1f}", spread


def _cell(interval: Interval | None, digits: int) -> str:
    """One number cell: the mean, then ± in small type padded to ``digits`` integer digits (a
    phantom where there is no interval), so every cell's ± part has the same width."""
    mean, spread = _number(interval)
    pad = digits - len(spread.split(".")[0]) if spread else 0
    text = rf"$\pm${spread}" + (rf"\hphantom{{{'0' * pad}}}" if pad > 0 else "") if spread else \
        rf"\hphantom{{$\pm${'0' * digits}.0}}"
    return rf"{mean}\,{{\scriptsize {text}}}"


def tabular(table: StudyTable) -> str:
    """The ``tabular`` alone (booktabs rules, the reference row shaded, baselines in italics)."""
    spec = "@{}l" + "r" * len(table.columns) + "@{}"
    head = " & ".join([tex(table_head(table.axes) if table.axes else "")]
                      + [rf"\multicolumn{{1}}{{c}}{{{tex(table_columns()[m])}}}" for m in table.columns]) + r" \\"
    spreads = [_number(v)[1] for r in table.rows for v in r.values.values()]
    digits = max((len(x.split(".")[0]) for x in spreads if x), default=1)
    most = max((r.n for r in table.rows if not r.baseline), default=0)
    lines = [rf"\begin{{tabular}}{{{spec}}}", r"\toprule", head, r"\midrule"]
    baseline_started = False
    for row in table.rows:
        if row.baseline and not baseline_started:
            lines.append(r"\midrule")
            baseline_started = True
        name = tex(row.setting)
        if row.baseline:
            name = rf"\textit{{{name}}}"
        elif row.n < most:  # fewer seeds finished here: say how many
            name += rf" {{\scriptsize(n={row.n})}}"
        cells = [_cell(row.values.get(m), digits) for m in table.columns]
        shade = rf"\rowcolor{{{REFERENCE_SHADE}}}" if row.reference else ""
        lines.append(shade + " & ".join([name, *cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def _reference_text(table: StudyTable) -> str:
    shaded = [r.setting for r in table.rows if r.reference]
    return f"shaded: the reference row ({shaded[0]})" if shaded else "no reference row"


def caption(table: StudyTable) -> str:
    """What the numbers are, n, the reference, the baselines, and the paper row it mirrors."""
    what = ", ".join(table_columns()[m] for m in table.columns) or "no accuracy logged"
    mirrors = f" Mirrors {table.paper}." if table.paper else ""
    setup = f" {'; '.join(table.notes)}." if table.notes else ""
    return (f"{table.title.capitalize()} ablation ({table.study}):{setup} Test accuracy (%) of "
            f"{what}: mean over {table.seeds_text()} ± the half-width of its {LEVEL:.0%} "
            f"t-interval; {_reference_text(table)}; italic: baselines (random init: the same "
            f"evaluations of an untrained encoder; from scratch: trained from random init for the "
            f"length best on validation).{mirrors}")


def study_latex(table: StudyTable, *, wide: bool | None = None) -> str:
    """A floating ``table`` (``table*`` when ``wide``, by default when it has four columns of
    numbers besides a two-axis setting) with its caption and unique label."""
    wide = len(table.columns) >= 4 and len(table.axes) > 1 if wide is None else wide
    env = "table*" if wide else "table"
    return "\n".join([
        rf"\begin{{{env}}}[t]", r"\centering", r"\footnotesize", r"\setlength{\tabcolsep}{3pt}",
        tabular(table), rf"\caption{{{tex(caption(table))}}}", rf"\label{{{table.label}}}",
        rf"\end{{{env}}}", "",
    ])


def combined_latex(tables: Sequence[StudyTable], label: str = "tab:ablations") -> str:
    """MAE Table 1: one ``table*`` with a sub-table per study, (a), (b), ... in the given order,
    two per row, each titled with its setting and the paper row it mirrors; one label."""
    if len(tables) > len(string.ascii_lowercase):
        raise ValueError(f"at most {len(string.ascii_lowercase)} sub-tables, not {len(tables)}")
    parts = [r"\begin{table*}[t]", r"\centering", r"\footnotesize", r"\setlength{\tabcolsep}{3pt}"]
    for i, table in enumerate(tables):
        mirrors = f" ({tex(table.paper)})" if table.paper else ""
        setup = "; ".join([*table.notes, table.seeds_text()])
        parts += [r"\begin{minipage}[t]{0.49\textwidth}", r"\centering", tabular(table) + r"\\[2pt]",
                  rf"({string.ascii_lowercase[i]}) \textbf{{{tex(table.title.capitalize())}}}{mirrors}. "
                  rf"{{\scriptsize {tex(setup)}}}",
                  r"\end{minipage}" + (r"\hfill" if i % 2 == 0 else r"\par\medskip")]
    studies = ", ".join(t.study for t in tables)
    text = (f"Ablations in the form of MAE Table 1 ({studies}). Test accuracy (%) of fine-tuning, "
            f"the linear probe, the few-shot probe and kNN where logged: the mean over seeds ± the "
            f"half-width of its {LEVEL:.0%} t-interval (n under each sub-table). Shaded: each "
            f"study's reference row. Italic: baselines (a random-init encoder, raw pixels, a model "
            f"trained from scratch for the length best on validation).")
    parts += [rf"\caption{{{tex(text)}}}", rf"\label{{{label}}}", r"\end{table*}", ""]
    return "\n".join(parts)


def preview_document(body: str) -> str:
    """A minimal two-column document around ``body``, for pdflatex; no page numbers, so a
    picture of the page cropped to its ink is the table and figure alone."""
    return "\n".join([r"\documentclass[twocolumn]{article}", *PACKAGES, r"\usepackage{graphicx}",
                      r"\pagestyle{empty}", r"\begin{document}", body, r"\end{document}", ""])


# ---------------------------------------------------------------------------------- HTML


def html_table(table: StudyTable) -> str:
    """The same table for a page: the reference row shaded (class ``reference``), baselines
    in italics (class ``baseline``), numbers right-aligned with one decimal."""
    e = html.escape
    head = "".join(f"<th>{e(table_columns()[m])} (%)</th>" for m in table.columns)
    body = []
    for row in table.rows:
        cls = "reference" if row.reference else "baseline" if row.baseline else ""
        cells = []
        for m in table.columns:
            mean, _ = _number(row.values.get(m))
            half = row.values[m].half_width if m in row.values else math.nan
            spread = f" <small>±{half:.1f}</small>" if half == half else ""
            cells.append(f"<td>{e(mean.replace('--', '—'))}{spread}</td>")
        name = e(row.setting) + (f" <small>(n={row.n})</small>" if not row.baseline else "")
        body.append(f'<tr class="{cls}"><th scope="row">{name}</th>{"".join(cells)}</tr>')
    return (f'<div class="scroll"><table class="paper"><thead><tr><th>{e(table.title)}</th>{head}</tr>'
            f"</thead><tbody>{''.join(body)}</tbody></table></div>")
