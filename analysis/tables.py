"""A report's tables: the frame as ``trials.csv``, every metric by cell (``summary.*``), the
study in MAE Table 1's form (``paper_table.tex``) and the rank correlations
(``correlations.*``); each writer returns what the page shows and the paths it wrote.

Every number is mean ± sd over seeds with n stated (accuracies also with the test set's
binomial standard error); failed cells stay in every table, marked with their reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from evaluation.metrics import block_metric_names

from . import paper_table
from .trials_frame import DOWNSTREAM_METRICS, FINAL_METRICS, RISK_METRICS
from .markdown import markdown_table
from .stats import CORRELATION_COLUMNS, correlation_reading, rank_correlations, summarise

SMOKE_NOTE = "smoke run: no correlation claimed"

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


def present(frame: pd.DataFrame, metrics: Sequence[str]) -> list[str]:
    """Those of ``metrics`` that some row of ``frame`` logged, in their order."""
    return [m for m in metrics if m in frame and frame[m].notna().any()]


def write_trials(frame: pd.DataFrame, axes: Sequence[str], out: Path) -> Path:
    """``trials.csv``: the frame itself, one row per trial (the cell's axes and the seed first,
    then status, then every other param and metric in name order)."""
    first = [c for c in [*axes, "seed", "status", "failure_reason", "run_id"] if c in frame]
    rest = sorted(c for c in frame.columns if c not in first)
    path = out / "trials.csv"
    frame[first + rest].to_csv(path, index=False)
    return path


def write_summary(frame: pd.DataFrame, study: str, by: list[str], out: Path,
                  run_id: str = "") -> tuple[pd.DataFrame, list[Path]]:
    """``summary.{csv,md,tex}``: the numeric summary (csv) and its ``mean ± sd`` text (md, tex;
    every metric, so wide: the paper's table is :func:`write_paper_table`'s)."""
    # every final metric (the effective ratio is a param, a column of the cell itself), + eval.probe_blocks'
    metrics = present(frame, (*FINAL_METRICS, *block_metric_names(frame.columns)))
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


def write_paper_table(frame: pd.DataFrame, study: str, axes: list[str], info: dict, reference: dict,
                       out: Path) -> tuple[paper_table.StudyTable, Path]:
    """``paper_table.tex``: the study in MAE Table 1's form (:mod:`analysis.paper_table`)."""
    table = paper_table.study_table(frame, study, axes, reference, info.get("paper"), info["run_id"],
                                    smoke=info["smoke"])
    path = out / "paper_table.tex"
    header = (f"% {study}: MAE Table 1 form. Needs: {' '.join(paper_table.PACKAGES)}\n"
              f"% made by mae-study report from parent run {info['run_id']}\n")
    path.write_text(header + paper_table.study_latex(table), encoding="utf-8")
    return table, path


def write_correlations(frame: pd.DataFrame, study: str, axes: list[str], out: Path,
                        smoke: bool = False) -> tuple[pd.DataFrame, str, list[str], list[Path]]:
    """``correlations.{csv,md}``: every (stratum, risk, downstream) row and the paragraph
    reading them; a smoke run keeps the rows but states no statistic."""
    finished = frame[frame["status"] == "FINISHED"]
    risks = present(finished, RISK_METRICS)
    correlations = rank_correlations(frame, risks, present(finished, DOWNSTREAM_METRICS), axes=axes)
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
