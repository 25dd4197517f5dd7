"""A study's ``index.html``: one self-contained page that explains itself.

The page is a title, a line naming the paper row the study mirrors, and the parts of the
report's sections in their order (:data:`analysis.sections.SECTIONS`: the declared claims
first, the links to every file last); this module holds the HTML they share (tables, figures,
the claims and the baselines). Figures are embedded as PNG data URIs, so the page is one file;
nothing runs on it (no script). Wide tables scroll inside their own box, so the page never runs
off a 1300 px screen.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
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
class Part:
    """One section's share of the page: its HTML, heading first (:mod:`analysis.sections`)."""
    html: str


@dataclass
class PageContent:
    study: str
    smoke: bool
    paper: str | None  # the paper row the study mirrors, named under the title
    parts: list[Part]  # in reading order


def html_table(table: pd.DataFrame) -> str:
    """A table in its own horizontal scroll box (a wide table never widens the page)."""
    return '<div class="scroll">' + table.to_html(index=False, border=0, na_rep="—", escape=True) + "</div>"


def figure_html(fig: Figure) -> str:
    e = html.escape
    data = base64.b64encode(fig.png).decode("ascii")
    return (f'<figure id="{e(fig.name)}"><img src="data:image/png;base64,{data}" alt="{e(fig.name)}">'
            f"<figcaption><code>{e(fig.name)}</code>: {e(fig.caption)}</figcaption></figure>")


def run_table(rows: Sequence[tuple[str, str]]) -> str:
    e = html.escape
    body = "".join(f"<tr><th scope='row'>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows)
    return f"<table class='run'>{body}</table>"


def baselines_html(text: str, table: pd.DataFrame) -> str:
    """The findings against the baselines: the verdicts counted per baseline, then every row;
    nothing without a table."""
    if not len(table):
        return ""
    e = html.escape
    short = table["verdict"].str.split(" at n=").str[0]  # a verdict's words without its n
    counts = "; ".join(f"against {e(name)}: " + ", ".join(f"{n} {e(v)}" for v, n in group.value_counts().items())
                       for name, group in short.groupby(table["against"], sort=False))
    return "\n".join(["<h3>Against the baselines</h3>", f"<p>{e(text)}</p>",
                      f"<p class='meta'>Verdicts over every row and metric, {counts}.</p>", html_table(table),
                      "<p class='meta'>Every number: <a href='baselines.csv'><code>baselines.csv</code></a>.</p>"])


def claims_html(text: str, table: pd.DataFrame, figure: Figure | None, skipped: Sequence[str]) -> str:
    """The declared claims: the forest plot, the words, the table, what was not decided;
    nothing when there is neither a decided nor a skipped claim."""
    if not len(table) and not skipped:
        return ""
    e = html.escape
    counts = ", ".join(f"{n} {e(v)}" for v, n in table["verdict"].value_counts().items()) \
        if len(table) else "none decided"
    if len(table) and "declared" in table:  # when each claim was written
        counts += "; declared: " + ", ".join(f"{n} {e(v)}" for v, n in table["declared"].value_counts().items())
    return "\n".join(["<h2>Declared claims</h2>", f"<p>{e(text)}</p>",
                      *([figure_html(figure)] if figure is not None else []),
                      f"<p class='meta'>Verdicts: {counts}.</p>",
                      html_table(table) if len(table) else "",
                      *(f"<p class='meta'>{e(line)}</p>" for line in skipped),
                      "<p class='meta'>Every number: <a href='claims.csv'><code>claims.csv</code></a>.</p>"])


def render(content: PageContent) -> str:
    """The whole page as one HTML string: the title, the line under it, every part in order."""
    e = html.escape
    smoke = " (smoke run)" if content.smoke else ""
    mirrors = f"Mirrors {e(content.paper)}. " if content.paper else ""
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mae-study report: {e(content.study)}{smoke}</title><style>{CSS}</style></head><body>",
        f"<h1>Study <code>{e(content.study)}</code>{smoke}</h1>",
        f"<p class='sub'>{mirrors}Every row of every trial: <a href='trials.csv'><code>trials.csv</code></a>.</p>",
        *(part.html for part in content.parts),
        f"<p class='meta'>Report generated {e(datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC'))} "
        f"by <code>mae-study report</code> from the MLflow store alone.</p>",
        "</body></html>", "",
    ])
