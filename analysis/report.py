"""One study's report: a folder of tables, figures and a self-contained ``index.html``.

Reads only the MLflow store (:mod:`analysis.trials_frame`), so a report never needs the Ray results
folder. :func:`write_report` loads the study's header and trials and runs each section of
:data:`analysis.sections.SECTIONS` in the page's order; each section computes, writes its files
and returns its parts of the page (:mod:`analysis.page`). What a report claims comes from
:mod:`analysis.stats` alone: the declared claims as one family (:mod:`analysis.claims_report`),
every row against the reference row and the baselines, outside the family
(:mod:`analysis.findings`), and rank correlations only among trials whose risk is the same
quantity (:mod:`analysis.tables`). A smoke run (parent tag ``smoke`` = "True") claims no
correlation and says so in its title.

Files written to ``out_dir``: ``claims.{csv,md}`` and ``fig_claims``, ``trials.csv`` (a row per
trial: every param and final metric, so anyone can recompute every number) with ``study.json``
(the study's header: axes, grid, reference, paper; :mod:`analysis.trials_file` reads the two
back), ``findings.md``, ``comparisons.csv`` (for a search ``search.csv``: its sampled configs
ranked within each arm), ``baselines.csv``, ``paper_table.tex`` (the study in MAE Table 1's
form), ``summary.{csv,md,tex}`` (every metric by cell), ``correlations.{csv,md}``, the figures
(:mod:`analysis.report_figures`), the variance files when ``mae-study variance`` ran, and
``index.html`` (PNGs embedded as data URIs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mae_core.files import FolderNotWritable, writable_folder

from . import figures, page, variance
from .trials_frame import ReportError, load_runs, load_study_info
from .sections import SECTIONS, ReportContext, Section


def _writable(out_dir: Path) -> Path:
    try:
        return writable_folder(out_dir)
    except FolderNotWritable as error:
        raise ReportError(f"report folder {error}") from None


def write_report(study: str, tracking_uri: str, out_dir: Path, *, formats: Sequence[str] = ("png", "pdf"),
                 experiment: str = "mae-study", parent_run_id: str | None = None,
                 smoke: bool | None = None, variance_dir: Path | None = None,
                 sections: Sequence[Section] | None = None) -> Path:
    """Write the report of ``study`` (its newest run, or its run ``parent_run_id``) into
    ``out_dir``; return the path of ``index.html``. ``smoke`` True or False reports only a smoke
    or only a full run, and refuses (one line) when the run found is of the other kind.
    ``variance_dir``: where ``mae-study variance`` wrote the study's ``variance.csv`` (default:
    ``out_dir``'s sibling ``variance/``, as for the default report folder); when it holds one,
    the report shows where the noise comes from (:mod:`analysis.variance`). ``sections``: the
    page's sections in order (default :data:`analysis.sections.SECTIONS`).

    Raises :class:`~analysis.trials_frame.ReportError` (one line) when the study has no runs, a
    format is unknown, or ``out_dir`` cannot be written.
    """
    unknown = [f for f in formats if f not in figures.FORMATS]
    if unknown:
        raise ReportError(f"figure format {unknown[0]!r} is not one of {', '.join(figures.FORMATS)}")
    info = load_study_info(tracking_uri, study, experiment, parent_run_id, smoke)
    frame = load_runs(tracking_uri, study, experiment, info["run_id"])
    out = _writable(out_dir)
    info["axes"] = [a for a in info["axes"] if a in frame]
    context = ReportContext(study, tracking_uri, experiment, info, frame, out, formats,
                            variance_dir or out.parent / variance.VARIANCE_DIR)
    parts = [part for section in (SECTIONS if sections is None else sections) for part in section.parts(context)]
    index = out / "index.html"
    index.write_text(page.render(page.PageContent(study, info["smoke"], info.get("paper"), parts)), encoding="utf-8")
    return index
