"""A study's ``index.html``: one self-contained page that explains itself.

In reading order: the declared claims and their verdicts (a forest plot, then the table), what was run (data, model, length, seeds, the exact command, commit, machine,
date), the findings in words (the verdicts of :mod:`analysis.stats`), the compact table in MAE
Table 1's form, the figures with their captions, the reconstructions, the rank correlations,
every metric by cell (folded away, it is wide), and links to every file. Figures are embedded
as PNG data URIs, so the page is one file; nothing runs on it (no script). Wide tables scroll
inside their own box, so the page never runs off a 1300 px screen.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pandas as pd

CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45;overflow-wrap:anywhere}
h1{font-size:1.6em;margin-bottom:.1em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
.sub{color:#555;margin-top:0}.meta{color:#555;font-size:.9em}
code{background:#f4f4f4;padding:0 .25em;border-radius:3px;overflow-wrap:anywhere}
.scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;font-size:.82em;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right;white-space:nowrap;overflow-wrap:normal}
th{background:#f2f2f2}td:last-child{text-align:left;white-space:normal}
table.run th{text-align:left;width:9em}table.run td{text-align:left;white-space:normal;overflow-wrap:anywhere}
table.run{width:100%;table-layout:fixed}
table.paper th[scope=row]{text-align:left;background:none;font-weight:normal}
table.paper tr.reference{background:#ececec}table.paper tr.baseline th{font-style:italic}
table.paper small{color:#666}
.failed{background:#fff1f0;border-left:4px solid #d4380d;padding:.4em .8em}
figure{margin:1.2em 0}figure img{max-width:100%;height:auto}figcaption{font-size:.88em;color:#444}
details{margin:.8em 0}summary{cursor:pointer;font-weight:600}
"""


@dataclass
class Figure:
    name: str
    caption: str
    png: bytes


@dataclass
class PageContent:
    study: str
    smoke: bool
    paper: str | None
    run_rows: list[tuple[str, str]]  # what was run: (what, value)
    findings_text: str
    findings_table: pd.DataFrame
    paper_table_html: str  # the compact table (analysis.paper_table.html_table)
    failures: list[str]  # "cell: FAILED ×1: reason" lines
    figures: list[Figure]
    reconstructions: list[Figure]
    correlation_reading: str
    correlations: pd.DataFrame
    summary: pd.DataFrame  # every metric by cell, as text
    files: list[str]
    notes_html: str = ""  # warnings above the findings (trials outside the spec's procedure)
    numbers_file: str = "comparisons.csv"  # search.csv for a search
    baselines_text: str = ""  # how the baselines are compared (shown only with a table)
    baselines_table: pd.DataFrame = field(default_factory=pd.DataFrame)  # each row against each baseline
    claims_text: str = ""  # how the declared claims were decided (analysis.claims_report.claims_text)
    claims_table: pd.DataFrame = field(default_factory=pd.DataFrame)  # a row per hypothesis, as text
    claims_figure: Figure | None = None  # the forest plot
    claims_skipped: list[str] = field(default_factory=list)  # claims this run could not decide, and why
    variance_html: str = ""  # "Where the noise comes from" (analysis.variance.section_html), when variance.csv exists


def html_table(table: pd.DataFrame) -> str:
    """A table in its own horizontal scroll box (a wide table never widens the page)."""
    return '<div class="scroll">' + table.to_html(index=False, border=0, na_rep="—", escape=True) + "</div>"


def _figure(fig: Figure) -> str:
    e = html.escape
    data = base64.b64encode(fig.png).decode("ascii")
    return (f'<figure id="{e(fig.name)}"><img src="data:image/png;base64,{data}" alt="{e(fig.name)}">'
            f"<figcaption><code>{e(fig.name)}</code>: {e(fig.caption)}</figcaption></figure>")


def _run_table(rows: Sequence[tuple[str, str]]) -> str:
    e = html.escape
    body = "".join(f"<tr><th scope='row'>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows)
    return f"<table class='run'>{body}</table>"


def _baselines(content: PageContent) -> list[str]:
    """The findings against the baselines: the verdicts counted per baseline, then every row."""
    table = content.baselines_table
    if not len(table):
        return []
    e = html.escape
    short = table["verdict"].str.split(" at n=").str[0]  # "not resolved at n=5 (…)" -> "not resolved"
    counts = "; ".join(f"against {e(name)}: " + ", ".join(f"{n} {e(v)}" for v, n in group.value_counts().items())
                       for name, group in short.groupby(table["against"], sort=False))
    return ["<h3>Against the baselines</h3>", f"<p>{e(content.baselines_text)}</p>",
            f"<p class='meta'>Verdicts over every row and metric, {counts}.</p>", html_table(table),
            "<p class='meta'>Every number: <a href='baselines.csv'><code>baselines.csv</code></a>.</p>"]


def _claims(content: PageContent) -> list[str]:
    """The declared claims first: the forest plot, the words, the table, what was not decided."""
    if not len(content.claims_table) and not content.claims_skipped:
        return []
    e = html.escape
    counts = ", ".join(f"{n} {e(v)}" for v, n in content.claims_table["verdict"].value_counts().items()) \
        if len(content.claims_table) else "none decided"
    if len(content.claims_table) and "declared" in content.claims_table:  # when each claim was written
        counts += "; declared: " + ", ".join(f"{n} {e(v)}" for v, n in
                                             content.claims_table["declared"].value_counts().items())
    return ["<h2>Declared claims</h2>", f"<p>{e(content.claims_text)}</p>",
            *([_figure(content.claims_figure)] if content.claims_figure is not None else []),
            f"<p class='meta'>Verdicts: {counts}.</p>",
            html_table(content.claims_table) if len(content.claims_table) else "",
            *(f"<p class='meta'>{e(line)}</p>" for line in content.claims_skipped),
            "<p class='meta'>Every number: <a href='claims.csv'><code>claims.csv</code></a>.</p>"]


def render(content: PageContent) -> str:
    """The whole page as one HTML string."""
    e = html.escape
    smoke = " (smoke run)" if content.smoke else ""
    mirrors = f"Mirrors {e(content.paper)}. " if content.paper else ""
    files = " · ".join(f'<a href="{e(f)}"><code>{e(f)}</code></a>' for f in content.files)
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mae-study report: {e(content.study)}{smoke}</title><style>{CSS}</style></head><body>",
        f"<h1>Study <code>{e(content.study)}</code>{smoke}</h1>",
        f"<p class='sub'>{mirrors}Every row of every trial: <a href='trials.csv'><code>trials.csv</code></a>.</p>",
        *_claims(content),
        content.variance_html,
        "<h2>What was run</h2>", _run_table(content.run_rows), content.notes_html,
        "<h2>Exploratory comparisons</h2>", f"<p>{e(content.findings_text)}</p>",
        html_table(content.findings_table) if len(content.findings_table) else "",
        f"<p class='meta'>Every number behind these words: <a href='{e(content.numbers_file)}'>"
        f"<code>{e(content.numbers_file)}</code></a>.</p>",
        *_baselines(content),
        "<h2>Results</h2>",
        "<p>In the form of MAE Table 1: test accuracy (%) as the mean over seeds with the half-width "
        "of its 95% t-interval in small type; shaded: the reference row; italic: baselines. The same "
        "table for a paper: <a href='paper_table.tex'><code>paper_table.tex</code></a>.</p>",
        *(f"<p class='failed'>{e(line)}</p>" for line in content.failures),
        content.paper_table_html,
        "<h2>Figures</h2>",
        *(map(_figure, content.figures) if content.figures else ["<p>No finished trials, so no figures.</p>"]),
        "<p class='meta'>Each figure is saved at the full text width (<code>fig_NAME.pdf</code>, 7 in) and "
        "at one column (<code>fig_NAME_column.pdf</code>, 3.3 in).</p>",
    ]
    if content.reconstructions:
        parts += ["<h2>Reconstructions</h2>", *map(_figure, content.reconstructions)]
    parts += [
        "<h2>Does lower risk mean a better representation?</h2>", f"<p>{e(content.correlation_reading)}</p>",
        html_table(content.correlations) if len(content.correlations) else
        "<p>No risk and downstream metric were both logged.</p>",
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
        html_table(content.summary), "</details>",
        f"<h2>Files</h2><p class='meta'>{files}</p>",
        f"<p class='meta'>Report generated {e(datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC'))} "
        f"by <code>mae-study report</code> from the MLflow store alone.</p>",
        "</body></html>", "",
    ]
    return "\n".join(parts)
