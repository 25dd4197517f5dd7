"""The report's sections: each computes its numbers, writes its files and returns its parts of
the page, so :func:`analysis.report.write_report` is a loop over :data:`SECTIONS` and a new
section is one class added to that list.

A section reads the study through a :class:`ReportContext` (the frame, the parent run's header,
the report folder); what two sections need alike (the findings' reference row, the claims, the
summary, the correlations) is computed once, by whichever asks first, through
:meth:`ReportContext.once`. Each file a section writes is named with :meth:`ReportContext.wrote`
and linked at the end of the page.
"""

from __future__ import annotations

import html
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from . import claims_report, paper_table, variance
from .findings import BASELINES_TEXT, Findings, cell_text, write_findings, write_search_findings
from .page import Figure, Part, claims_html, baselines_html, figure_html, html_table, run_table
from .provenance import provenance
from .report_figures import make_figures, reconstructions
from .tables import write_correlations, write_paper_table, write_summary, write_trials
from .trials_file import write_study_info


@dataclass
class ReportContext:
    """What every section reads: the study, its parent run's header (``info``: axes, grid,
    reference, claims, smoke, ...), its trials (``frame``), and where the report goes."""
    study: str
    tracking_uri: str
    experiment: str
    info: dict  # its "axes": the study's axes found in the frame (write_report keeps only those)
    frame: pd.DataFrame
    out: Path  # the report folder, writable
    formats: Sequence[str]  # figure formats
    variance_dir: Path  # where `mae-study variance` wrote variance.csv (maybe nowhere)
    files: list[str] = field(default_factory=list)  # what the sections wrote, in order
    _shared: dict[str, Any] = field(default_factory=dict)

    @property
    def axes(self) -> list[str]:
        """The study's axes found in the frame."""
        return self.info["axes"]

    @property
    def by(self) -> list[str]:
        """The cell's keys in tables: the axes, and the effective ratio beside the nominal one
        (a property of the cell)."""
        effective = "mask_ratio" in self.axes and "effective_mask_ratio" in self.frame
        return self.axes + (["effective_mask_ratio"] if effective else [])

    def once(self, key: str, compute: Callable[[ReportContext], Any]) -> Any:
        """``compute(self)``, memoised under ``key``: a computation two sections share runs
        (and writes its files) once, for whichever section asks first."""
        if key not in self._shared:
            self._shared[key] = compute(self)
        return self._shared[key]

    def wrote(self, *paths: Path | str) -> None:
        """Name files written into the report folder (linked under "Files")."""
        self.files += [Path(p).name for p in paths]


class Section(Protocol):
    """One section of the report: ``parts`` computes, writes its files (naming them with
    ``context.wrote``) and returns its parts of the page, in order; none is fine."""

    def parts(self, context: ReportContext) -> list[Part]: ...


# ------------------------------------------------------------------ computations sections share


def findings(context: ReportContext) -> Findings:
    """The exploratory findings (a search's ranking for a search), written once."""
    def compute(c: ReportContext) -> Findings:
        write = write_search_findings if c.info.get("search") else write_findings
        result, paths = write(c.frame, c.study, c.axes, c.info, c.out)
        c.wrote(*paths)
        return result
    return context.once("findings", compute)


def claims(context: ReportContext) -> tuple[claims_report.Claims, bytes | None]:
    """The declared claims decided as one family, and their forest plot's PNG, written once."""
    def compute(c: ReportContext):
        decided = claims_report.decide(c.frame, c.study, c.info, c.info.get("claims") or [])
        paths, png = claims_report.write_claims(decided, c.study, c.out, c.formats)
        c.wrote(*paths)
        return decided, png
    return context.once("claims", compute)


def summary(context: ReportContext) -> pd.DataFrame:
    """Every metric by cell as text (``summary.*``), written once."""
    def compute(c: ReportContext) -> pd.DataFrame:
        display, paths = write_summary(c.frame, c.study, c.by, c.out, c.info["run_id"])
        c.wrote(*paths)
        return display
    return context.once("summary", compute)


def correlations(context: ReportContext) -> tuple[pd.DataFrame, str, list[str]]:
    """The rank correlations, the paragraph reading them and the risks logged, written once."""
    def compute(c: ReportContext):
        table, reading, risks, paths = write_correlations(c.frame, c.study, c.axes, c.out, smoke=c.info["smoke"])
        c.wrote(*paths)
        return table, reading, risks
    return context.once("correlations", compute)


# ---------------------------------------------------------------------------------- sections

CLAIMS_CAPTION = ("Each declared claim's effect (cell − reference, paired by seed) with its simultaneous interval, "
                  "in units of the claim's smallest effect of interest and oriented so that right is better; "
                  "the grey band is ±delta. Colour and word: the verdict (better, worse, equivalent within "
                  "±delta, inconclusive). In brackets after each claim: when it was declared (before: registered "
                  "when the study started; after: exploratory; unregistered: its study file was not committed).")


class DeclaredClaims:
    """The declared claims and their verdicts: a forest plot, then the table (``claims.*``)."""

    def parts(self, context: ReportContext) -> list[Part]:
        decided, png = claims(context)
        figure = Figure("claims", CLAIMS_CAPTION, png) if png else None
        text = claims_html(decided.text, claims_report.display_table(decided.table), figure, decided.skipped)
        return [Part(text)] if text else []


class Variance:
    """Where the noise comes from, when ``mae-study variance`` wrote the study's ``variance.csv``."""

    def parts(self, context: ReportContext) -> list[Part]:
        text, copied = variance_section(context.variance_dir, context.out, claims(context)[0].table)
        context.wrote(*copied)
        return [Part(text)] if text else []


class WhatWasRun:
    """What was run (data, model, length, seeds, the exact command, commit, machine, date), with
    ``trials.csv`` and ``study.json``: enough to recompute every number."""

    def parts(self, context: ReportContext) -> list[Part]:
        context.wrote(write_trials(context.frame, context.axes, context.out),
                      write_study_info(context.info, context.out))  # with trials.csv, enough to rebuild the tables
        rows = provenance(context.tracking_uri, context.study, context.info, context.frame).rows
        rows = rows + [("experiment", context.experiment)]
        return [Part("\n".join(["<h2>What was run</h2>", run_table(rows), outside_procedure_note(context.frame)]))]


class ExploratoryComparisons:
    """Every row against the reference row and against the baselines, outside the family."""

    def parts(self, context: ReportContext) -> list[Part]:
        found = findings(context)
        numbers = "search.csv" if context.info.get("search") else "comparisons.csv"
        return [Part("\n".join([
            "<h2>Exploratory comparisons</h2>", f"<p>{html.escape(found.text)}</p>",
            html_table(found.display) if len(found.display) else "",
            f"<p class='meta'>Every number behind these words: <a href='{numbers}'><code>{numbers}</code></a>.</p>",
            baselines_html(BASELINES_TEXT, found.baselines)]))]


class Results:
    """The study in MAE Table 1's form (``paper_table.tex``), failed cells named above it."""

    def parts(self, context: ReportContext) -> list[Part]:
        c = context
        table, path = write_paper_table(c.frame, c.study, c.axes, c.info, findings(c).reference, c.out)
        c.wrote(path)
        display = summary(c)
        failures = [f"{cell_text({a: row[a] for a in c.axes}) if c.axes else c.study}: {row['note']}"
                    for _, row in display[display["note"] != ""].iterrows()]
        return [Part("\n".join([
            "<h2>Results</h2>",
            "<p>In the form of MAE Table 1: test accuracy (%) as the mean over seeds with the half-width "
            "of its 95% t-interval in small type; shaded: the reference row; italic: baselines. The same "
            "table for a paper: <a href='paper_table.tex'><code>paper_table.tex</code></a>.</p>",
            *(f"<p class='failed'>{html.escape(line)}</p>" for line in failures),
            paper_table.html_table(table)]))]


class Figures:
    """Every figure the study gets (:mod:`analysis.report_figures`), with its caption."""

    def parts(self, context: ReportContext) -> list[Part]:
        c = context
        table, _, risks = correlations(c)
        made, names = make_figures(c.frame, c.axes, c.tracking_uri, table, risks, c.out, c.formats, c.info)
        c.wrote(*names)
        return [Part("\n".join([
            "<h2>Figures</h2>",
            *(map(figure_html, made) if made else ["<p>No finished trials, so no figures.</p>"]),
            "<p class='meta'>Each figure is saved at the full text width (<code>fig_NAME.pdf</code>, 7 in) and "
            "at one column (<code>fig_NAME_column.pdf</code>, 3.3 in).</p>"]))]


class Reconstructions:
    """Each cell's reconstructions (its lowest finished seed), when the trials logged them."""

    def parts(self, context: ReportContext) -> list[Part]:
        shown, names = reconstructions(context.frame, context.axes, context.tracking_uri, context.out,
                                       context.formats)
        context.wrote(*names)
        return [Part("\n".join(["<h2>Reconstructions</h2>", *map(figure_html, shown)]))] if shown else []


class Correlations:
    """Does lower risk mean a better representation? The rank correlations (``correlations.*``)."""

    def parts(self, context: ReportContext) -> list[Part]:
        table, reading, _ = correlations(context)
        return [Part("\n".join([
            "<h2>Does lower risk mean a better representation?</h2>", f"<p>{html.escape(reading)}</p>",
            html_table(table.round(3)) if len(table) else "<p>No risk and downstream metric were both logged.</p>"]))]


class EveryMetric:
    """Every metric by cell (``summary.*``), folded away: it is wide."""

    def parts(self, context: ReportContext) -> list[Part]:
        return [Part("\n".join([
            "<h2>Every metric by cell</h2>",
            "<details><summary>The full summary (mean ± sd over seeds; wide: it scrolls)</summary>",
            "<p>Mean ± sd over seeds (sample sd, ddof=1); <code>n</code> counts finished runs, "
            "<code>n_failed</code> failed ones; a metric computed on fewer runs states its own n. "
            "Risks are in target units² (pixel² for raw targets); lower is better. Accuracies are "
            "fractions on the test split (every probe setting chosen on a validation split carved from "
            "the training split); higher is better; <code>random_*</code> columns are the same "
            "evaluation of a freshly initialised model, <code>pixel_probe_*</code> the same probes on "
            "raw pixels, <code>scratch_best_finetune_acc</code> a model trained from scratch for the "
            "length best on validation. <code>test_allvisible_rec_risk</code> (an MAE with every "
            "patch visible) is not a risk of the specification and is never correlated; "
            "<code>(test ±se)</code> is the test set's binomial standard error "
            "√(p(1−p)/n<sub>test</sub>), the uncertainty of one trial's accuracy from the finite test "
            "set, beside the spread over seeds.</p>",
            html_table(summary(context)), "</details>"]))]


class Files:
    """Links to every file the sections before it wrote, and to the page itself: keep it last."""

    def parts(self, context: ReportContext) -> list[Part]:
        e = html.escape
        links = " · ".join(f'<a href="{e(f)}"><code>{e(f)}</code></a>' for f in [*context.files, "index.html"])
        return [Part(f"<h2>Files</h2><p class='meta'>{links}</p>")]


# The page's reading order. Computations two sections share run for the first that asks.
SECTIONS: list[Section] = [DeclaredClaims(), Variance(), WhatWasRun(), ExploratoryComparisons(), Results(),
                           Figures(), Reconstructions(), Correlations(), EveryMetric(), Files()]


# ---------------------------------------------------------------------------------- helpers


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


def variance_section(folder: Path, out: Path, claims: pd.DataFrame | None = None) -> tuple[str, list[str]]:
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
